package fault

import "syscall"

// sysProcAttr puts a server in its own process group (a ^C on the runner
// does not reach it first) and kills it if the process that started it dies.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
