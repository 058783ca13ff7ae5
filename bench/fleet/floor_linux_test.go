package fleet

import (
	"fmt"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/cputime"
)

// epollFloor runs one level of BenchmarkWakeFloor with one epoll loop on a locked
// thread over sockets made with system calls, so that Go's netpoller never sees them.
// With a window, it sleeps that long after each round of reads and then looks again
// without waiting, waiting only once nothing is ready.
func epollFloor(b *testing.B, conns, rate int, d time.Duration, size int, window time.Duration) floorResult {
	lfd, addr := rawListener(b, conns)
	defer syscall.Close(lfd)
	wr := startFloorWriter(b, addr, conns, rate, d, size)
	defer wr.stop()

	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		b.Fatal(err)
	}
	defer syscall.Close(epfd)
	counters := make(map[int32]*frameCounter, conns)
	for range conns {
		fd, err := acceptRaw(lfd, syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC)
		if err != nil {
			b.Fatal(err)
		}
		defer syscall.Close(fd)
		ev := syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(fd)}
		if err := syscall.EpollCtl(epfd, syscall.EPOLL_CTL_ADD, fd, &ev); err != nil {
			b.Fatal(err)
		}
		counters[int32(fd)] = &frameCounter{}
	}
	buf := make([]byte, 64<<10)
	events := make([]syscall.EpollEvent, conns)
	start := time.Now()
	cpu0, _ := cputime.Process()
	timeout := -1 // wait for the first ready connection
	for open := conns; open > 0; {
		n, err := syscall.EpollWait(epfd, events, timeout)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			b.Fatal(err)
		}
		if n == 0 { // a look after the window found nothing: wait again
			timeout = -1
			continue
		}
		for _, ev := range events[:n] {
			m, err := syscall.Read(int(ev.Fd), buf)
			switch {
			case err == syscall.EAGAIN || err == syscall.EINTR:
			case err != nil || m == 0: // the writer closed it (or it failed): done with it
				_ = syscall.EpollCtl(epfd, syscall.EPOLL_CTL_DEL, int(ev.Fd), nil)
				open--
			default:
				counters[ev.Fd].feed(buf[:m])
			}
		}
		if window > 0 {
			pause(window)
			timeout = 0
		}
	}
	cpu1, _ := cputime.Process()
	wall := time.Since(start)
	sent := wr.finish(b)
	var msgs int64
	for _, c := range counters {
		msgs += c.msgs
	}
	return floorResult{msgs: msgs, sent: sent, wall: wall, cpu: cpu1 - cpu0, measured: true}
}

// rawListener is a loopback listener made with system calls (Go's netpoller never sees
// it or what it accepts), its accept bounded by acceptWithin.
func rawListener(b *testing.B, conns int) (int, string) {
	lfd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		b.Fatal(err)
	}
	if err := syscall.Bind(lfd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		b.Fatal(err)
	}
	if err := syscall.Listen(lfd, conns); err != nil {
		b.Fatal(err)
	}
	// accept(2) on a blocking socket waits at most its receive timeout: a writer that
	// fails before it has dialled every connection does not leave it waiting for ever.
	tv := syscall.NsecToTimeval(acceptWithin.Nanoseconds())
	if err := syscall.SetsockoptTimeval(lfd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv); err != nil {
		b.Fatal(err)
	}
	sa, err := syscall.Getsockname(lfd)
	if err != nil {
		b.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	return lfd, addr
}

// acceptRaw accepts on a raw listener, again when a signal interrupts it (the Go
// runtime's preemption signals reach a thread blocked in accept(2)).
func acceptRaw(lfd, flags int) (int, error) {
	for {
		fd, _, err := syscall.Accept4(lfd, flags)
		if err != syscall.EINTR {
			return fd, err
		}
	}
}

// pause sleeps d in this thread (nanosleep, not the Go runtime's timers: a locked
// thread's time.Sleep wakes through another thread), the rest of it again when a
// signal interrupts it.
func pause(d time.Duration) {
	ts := syscall.NsecToTimespec(d.Nanoseconds())
	for {
		var left syscall.Timespec
		if syscall.Nanosleep(&ts, &left) != syscall.EINTR {
			return
		}
		ts = left
	}
}

// sleepWakes sleeps window over and over for d on a locked thread and returns the
// wake-ups and this process's CPU time over them (BenchmarkSleepWake).
func sleepWakes(window, d time.Duration) (int, time.Duration, bool) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cpu0, ok := cputime.Process()
	if !ok {
		return 0, 0, false
	}
	n := int(d / window)
	for range n {
		pause(window)
	}
	cpu1, _ := cputime.Process()
	return n, cpu1 - cpu0, true
}
