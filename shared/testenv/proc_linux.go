package testenv

import "syscall"

// sysProcAttr makes a child process receive SIGTERM when the test process
// dies, so that a killed test run leaves no server behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
}
