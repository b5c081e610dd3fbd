package pgbouncer

import "syscall"

// sysProcAttr puts PgBouncer in its own process group (a ^C on the test
// does not reach it first) and kills it if the test binary dies (unless it
// dropped root to another user, which clears that).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
