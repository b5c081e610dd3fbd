package loopback

import "syscall"

// sysProcAttr puts a server in its own process group (a ^C on the test
// does not reach it first) and kills it if the process that started it
// dies (unless it drops root to another user, which clears that).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
