package tests

import (
	"fmt"
	"os"
	"syscall"
	"unsafe"
)

// openPTY opens a new pseudo-terminal of 160 columns by 50 rows: the
// master, which the test reads and answers through, and the slave, which
// the command gets as its standard streams.
func openPTY() (master, slave *os.File, err error) {
	master, err = os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open pty: %w", err)
	}
	var n uint32
	if err := ioctl(master, syscall.TIOCSPTLCK, unsafe.Pointer(new(int32))); err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("unlock pty: %w", err)
	}
	if err := ioctl(master, syscall.TIOCGPTN, unsafe.Pointer(&n)); err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("number of pty: %w", err)
	}
	slave, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("open pty slave: %w", err)
	}
	size := struct{ rows, cols, x, y uint16 }{rows: 50, cols: 160}
	if err := ioctl(slave, syscall.TIOCSWINSZ, unsafe.Pointer(&size)); err != nil {
		master.Close()
		slave.Close()
		return nil, nil, fmt.Errorf("size pty: %w", err)
	}
	return master, slave, nil
}

// ioctl runs one ioctl on f without taking f out of the runtime's poller
// (as f.Fd would), so that closing the master ends a read blocked on it.
func ioctl(f *os.File, req uint, arg unsafe.Pointer) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var errno syscall.Errno
	if err := rc.Control(func(fd uintptr) {
		_, _, errno = syscall.Syscall(syscall.SYS_IOCTL, fd, uintptr(req), uintptr(arg))
	}); err != nil {
		return err
	}
	if errno != 0 {
		return errno
	}
	return nil
}
