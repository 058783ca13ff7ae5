package fleet

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/kvindex/kvindex/internal/cputime"
)

// The io_uring reader of BenchmarkWakeFloor: a minimal ring (setup, the three mappings,
// receives queued and completions reaped through the shared rings with atomic head and
// tail updates, io_uring_enter to submit and wait), enough to measure what reading costs
// without a read system call per message. It is a measurement, not serve's reader.

// io_uring's ABI, as much of it as uringFloor uses (linux/io_uring.h). The system call
// numbers are the same on every architecture.
const (
	sysIOUringSetup = 425
	sysIOUringEnter = 426

	uringOffSQRing = 0
	uringOffCQRing = 0x8000000
	uringOffSQEs   = 0x10000000

	uringOpRecv       = 27
	uringEnterGetEvts = 1
	uringFeatSingle   = 1

	uringSetupCoopTaskrun  = 1 << 8
	uringSetupSingleIssuer = 1 << 12
	uringSetupDeferTaskrun = 1 << 13
)

type uringSQOff struct {
	head, tail, ringMask, ringEntries, flags, dropped, array, resv1 uint32
	userAddr                                                        uint64
}

type uringCQOff struct {
	head, tail, ringMask, ringEntries, overflow, cqes, flags, resv1 uint32
	userAddr                                                        uint64
}

type uringParams struct {
	sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFd uint32
	resv                                                                   [3]uint32
	sqOff                                                                  uringSQOff
	cqOff                                                                  uringCQOff
}

type uringSQE struct {
	opcode      uint8
	flags       uint8
	ioprio      uint16
	fd          int32
	off         uint64
	addr        uint64
	len         uint32
	opFlags     uint32
	userData    uint64
	bufIndex    uint16
	personality uint16
	spliceFdIn  int32
	addr3       uint64
	pad         uint64
}

type uringCQE struct {
	userData uint64
	res      int32
	flags    uint32
}

// uring is one ring: its mapped memory and the pointers into it.
type uring struct {
	fd                    int
	sqRing, cqRing, sqes  []byte
	sqHead, sqTail, sqArr unsafe.Pointer
	sqMask, cqMask        uint32
	cqHead, cqTail        *uint32
	cqes                  unsafe.Pointer
	sqeBase               unsafe.Pointer
	pending               uint32 // SQEs queued since the last enter
}

func newURing(entries uint32, flags uint32) (*uring, error) {
	var p uringParams
	p.flags = flags
	fd, _, e := syscall.Syscall(sysIOUringSetup, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	if e != 0 {
		return nil, fmt.Errorf("io_uring_setup: %w", e)
	}
	r := &uring{fd: int(fd)}
	sqSize := int(p.sqOff.array + p.sqEntries*4)
	cqSize := int(p.cqOff.cqes + p.cqEntries*uint32(unsafe.Sizeof(uringCQE{})))
	if p.features&uringFeatSingle != 0 {
		sqSize = max(sqSize, cqSize)
	}
	var err error
	if r.sqRing, err = syscall.Mmap(r.fd, uringOffSQRing, sqSize, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_POPULATE); err != nil {
		return nil, err
	}
	r.cqRing = r.sqRing
	if p.features&uringFeatSingle == 0 {
		if r.cqRing, err = syscall.Mmap(r.fd, uringOffCQRing, cqSize, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_POPULATE); err != nil {
			return nil, err
		}
	}
	if r.sqes, err = syscall.Mmap(r.fd, uringOffSQEs, int(p.sqEntries)*int(unsafe.Sizeof(uringSQE{})), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_POPULATE); err != nil {
		return nil, err
	}
	sq, cq := unsafe.Pointer(&r.sqRing[0]), unsafe.Pointer(&r.cqRing[0])
	r.sqHead, r.sqTail, r.sqArr = unsafe.Add(sq, p.sqOff.head), unsafe.Add(sq, p.sqOff.tail), unsafe.Add(sq, p.sqOff.array)
	r.sqMask = *(*uint32)(unsafe.Add(sq, p.sqOff.ringMask))
	r.cqMask = *(*uint32)(unsafe.Add(cq, p.cqOff.ringMask))
	r.cqHead, r.cqTail = (*uint32)(unsafe.Add(cq, p.cqOff.head)), (*uint32)(unsafe.Add(cq, p.cqOff.tail))
	r.cqes = unsafe.Add(cq, p.cqOff.cqes)
	r.sqeBase = unsafe.Pointer(&r.sqes[0])
	return r, nil
}

func (r *uring) close() {
	_ = syscall.Munmap(r.sqes)
	if &r.cqRing[0] != &r.sqRing[0] {
		_ = syscall.Munmap(r.cqRing)
	}
	_ = syscall.Munmap(r.sqRing)
	_ = syscall.Close(r.fd)
}

// recv queues a receive of fd into buf, which must stay mapped until it completes or
// the ring is closed.
func (r *uring) recv(fd int, buf []byte, userData uint64) {
	tail := atomic.LoadUint32((*uint32)(r.sqTail))
	idx := tail & r.sqMask
	sqe := (*uringSQE)(unsafe.Add(r.sqeBase, uintptr(idx)*unsafe.Sizeof(uringSQE{})))
	*sqe = uringSQE{opcode: uringOpRecv, fd: int32(fd), addr: uint64(uintptr(unsafe.Pointer(&buf[0]))), len: uint32(len(buf)), userData: userData}
	*(*uint32)(unsafe.Add(r.sqArr, uintptr(idx)*4)) = idx
	atomic.StoreUint32((*uint32)(r.sqTail), tail+1)
	r.pending++
}

// enter submits what is queued and waits for at least minComplete completions.
func (r *uring) enter(minComplete uint32) error {
	for {
		n, _, e := syscall.Syscall6(sysIOUringEnter, uintptr(r.fd), uintptr(r.pending), uintptr(minComplete), uringEnterGetEvts, 0, 0)
		if e == syscall.EINTR {
			continue
		}
		if e != 0 {
			return fmt.Errorf("io_uring_enter: %w", e)
		}
		r.pending -= uint32(n)
		return nil
	}
}

// reap calls fn for every completion posted.
func (r *uring) reap(fn func(userData uint64, res int32)) int {
	head := atomic.LoadUint32(r.cqHead)
	tail := atomic.LoadUint32(r.cqTail)
	n := 0
	for ; head != tail; head++ {
		cqe := (*uringCQE)(unsafe.Add(r.cqes, uintptr(head&r.cqMask)*unsafe.Sizeof(uringCQE{})))
		ud, res := cqe.userData, cqe.res
		atomic.StoreUint32(r.cqHead, head+1)
		fn(ud, res)
		n++
	}
	return n
}

// uringModes are the rings uringFloor sets up: which thread runs the kernel's
// completion work (task work), and when.
var uringModes = []struct {
	name  string
	flags uint32
}{
	{"plain", 0},
	{"coop", uringSetupCoopTaskrun},
	{"defer", uringSetupSingleIssuer | uringSetupDeferTaskrun},
}

// uringFloor runs one level of BenchmarkWakeFloor with one io_uring: a receive queued
// per connection into its own buffer, completions reaped after each wait (and, with a
// window, after sleeping it), every completed connection's receive queued again and
// submitted with the next wait: no read system call per message.
func uringFloor(b *testing.B, conns, rate int, d time.Duration, size int, window time.Duration, flags uint32) floorResult {
	lfd, addr := rawListener(b, conns)
	defer syscall.Close(lfd)
	wr := startFloorWriter(b, addr, conns, rate, d, size)
	defer wr.stop()

	if flags&uringSetupSingleIssuer != 0 {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
	}
	// The receive buffers are mapped apart from Go's heap and unmapped only after the
	// ring is closed: a receive a failed level leaves queued can never write into memory
	// Go has reused (the kernel's write to an unmapped page fails instead).
	const bufSize = 8 << 10
	mem, err := syscall.Mmap(-1, 0, conns*bufSize, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		b.Fatal(err)
	}
	defer syscall.Munmap(mem)
	r, err := newURing(256, flags)
	if err != nil {
		b.Skipf("SKIP: %v", err)
	}
	defer r.close()
	fds := make([]int, conns)
	bufs := make([][]byte, conns)
	counters := make([]frameCounter, conns)
	for i := range conns {
		fd, err := acceptRaw(lfd, syscall.SOCK_CLOEXEC)
		if err != nil {
			b.Fatal(err)
		}
		defer syscall.Close(fd)
		fds[i], bufs[i] = fd, mem[i*bufSize:(i+1)*bufSize:(i+1)*bufSize]
	}
	start := time.Now()
	cpu0, _ := cputime.Process()
	for i := range conns {
		r.recv(fds[i], bufs[i], uint64(i))
	}
	open := conns
	var failed error
	done := func(ud uint64, res int32) {
		switch {
		case res > 0:
			counters[ud].feed(bufs[ud][:res])
			r.recv(fds[ud], bufs[ud], ud)
		case res == -int32(syscall.EINTR) || res == -int32(syscall.EAGAIN):
			r.recv(fds[ud], bufs[ud], ud)
		default: // 0: the writer closed it; < 0: it failed
			if res < 0 && failed == nil {
				failed = syscall.Errno(-res)
			}
			open--
		}
	}
	wait := uint32(1) // wait for the first completion
	for open > 0 && failed == nil {
		if err := r.enter(wait); err != nil {
			b.Fatal(err)
		}
		if r.reap(done) == 0 { // a look after the window found nothing: wait again
			wait = 1
			continue
		}
		if window > 0 {
			pause(window)
			wait = 0
		}
	}
	cpu1, _ := cputime.Process()
	wall := time.Since(start)
	if failed != nil {
		b.Fatal(failed)
	}
	sent := wr.finish(b)
	return floorResult{msgs: sumMsgs(counters), sent: sent, wall: wall, cpu: cpu1 - cpu0, measured: true}
}
