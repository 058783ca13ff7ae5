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
func epollFloor(b *testing.B, conns, rate int, d time.Duration, size int) floorResult {
	lfd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer syscall.Close(lfd)
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
		fd, _, err := syscall.Accept4(lfd, syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC)
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
	for open := conns; open > 0; {
		n, err := syscall.EpollWait(epfd, events, -1)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			b.Fatal(err)
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
	}
	cpu1, _ := cputime.Process()
	wall := time.Since(start)
	wr.finish(b)
	var msgs int64
	for _, c := range counters {
		msgs += c.msgs
	}
	return floorResult{msgs: msgs, wall: wall, cpu: cpu1 - cpu0, measured: true}
}
