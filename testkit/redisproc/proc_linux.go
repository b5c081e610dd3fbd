package redisproc

import "syscall"

// sysProcAttr puts the server in its own process group (a ^C on the test
// does not reach it first) and kills it if the test binary dies.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
