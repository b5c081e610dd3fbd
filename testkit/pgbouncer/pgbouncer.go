//go:build unix

package pgbouncer

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekey/oncekey/testkit/loopback"
)

// startTimeout bounds how long PgBouncer may take to answer on its admin
// console.
const startTimeout = 15 * time.Second

// defaultDatabaseURL is testenv.DefaultDatabaseURL (not imported: testenv
// imports testing, and this package is usable outside tests).
const defaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// ErrNoBinary is returned by [Binary] and [New] when no pgbouncer binary is
// found.
var ErrNoBinary = errors.New("pgbouncer: pgbouncer not found (apt-get install pgbouncer, or set PGBOUNCER)")

// Options configure one PgBouncer.
type Options struct {
	// Target is the PostgreSQL server to pool: a connection URL whose host,
	// port, user and password are used. Empty: DATABASE_URL, else
	// postgres://postgres@127.0.0.1:5432/test.
	Target string
	// PoolMode is "transaction" (the default), "session" or "statement".
	PoolMode string
	// PoolSize is default_pool_size: server connections per database and
	// user. Default 20.
	PoolSize int
	// IgnoreStartupParameters lists startup parameters PgBouncer accepts
	// from clients and drops (ignore_startup_parameters). By default it
	// refuses any it does not know, closing the connection.
	IgnoreStartupParameters []string
	// Databases adds aliases: name → extra settings of its [databases]
	// line (for example "dbname=test connect_query='SET synchronous_commit = off'").
	// The host and port of Target are added; dbname defaults to the alias.
	Databases map[string]string
	// Settings are extra lines of the [pgbouncer] section, key → value.
	Settings map[string]string
}

// Bouncer is one pgbouncer process on a loopback port.
type Bouncer struct {
	bin    string
	dir    string
	port   int
	target *pgconn.Config
	opts   Options
	runAs  *user.User // nil unless run as root

	mu   sync.Mutex
	proc *loopback.Process // nil while not running
}

// TB is the part of testing.TB that [Start] uses. The package does not
// import testing.
type TB = loopback.TB

// Binary returns the path of the pgbouncer binary: $PGBOUNCER when set,
// else pgbouncer on $PATH, else /usr/sbin/pgbouncer. The error matches
// [ErrNoBinary] when there is none.
func Binary() (string, error) {
	if p := os.Getenv("PGBOUNCER"); p != "" {
		return p, nil
	}
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	const debian = "/usr/sbin/pgbouncer"
	if fi, err := os.Stat(debian); err == nil && !fi.IsDir() {
		return debian, nil
	}
	return "", ErrNoBinary
}

// New starts a PgBouncer on a free loopback port in front of the target
// server and waits until its admin console answers. [Bouncer.Close] stops
// it and removes its directory. The error matches [ErrNoBinary] when
// pgbouncer is not installed.
func New(opts Options) (*Bouncer, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	if opts.PoolMode == "" {
		opts.PoolMode = "transaction"
	}
	if opts.PoolSize == 0 {
		opts.PoolSize = 20
	}
	raw := opts.Target
	if raw == "" {
		raw = os.Getenv("DATABASE_URL")
	}
	if raw == "" {
		raw = defaultDatabaseURL
	}
	target, err := pgconn.ParseConfig(raw)
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: target: %w", err)
	}
	b := &Bouncer{bin: bin, target: target, opts: opts}
	if os.Geteuid() == 0 {
		if b.runAs, err = user.Lookup("postgres"); err != nil {
			if b.runAs, err = user.Lookup("nobody"); err != nil {
				return nil, fmt.Errorf("pgbouncer: run as root and no postgres or nobody user to run as: %w", err)
			}
		}
	}
	if b.dir, err = os.MkdirTemp("", "pgbouncer-"); err != nil {
		return nil, fmt.Errorf("pgbouncer: %w", err)
	}
	err = loopback.OnFreePort(func(port int) error {
		b.port = port
		if err := b.writeConfig(); err != nil {
			return err
		}
		return b.start()
	})
	if err == nil {
		return b, nil
	}
	os.RemoveAll(b.dir)
	return nil, fmt.Errorf("pgbouncer: start: %w", err)
}

// Start is [New] for a test: the bouncer is closed when the test ends. When
// pgbouncer is missing the test fails with CI=true (CI must never pass by
// skipping) and is skipped with the reason otherwise; any other error fails
// it.
func Start(t TB, opts Options) *Bouncer {
	t.Helper()
	b, err := New(opts)
	return loopback.ForTest(t, b, err, ErrNoBinary)
}

// Addr returns "127.0.0.1:port".
func (b *Bouncer) Addr() string { return "127.0.0.1:" + strconv.Itoa(b.port) }

// Port returns the bouncer's port. It stays the same across [Bouncer.Restart].
func (b *Bouncer) Port() int { return b.port }

// Dir returns the bouncer's directory (pgbouncer.ini, userlist.txt,
// pgbouncer.log).
func (b *Bouncer) Dir() string { return b.dir }

// URL returns a connection URL to database (a database of the server, or
// an alias of [Options.Databases]) through the bouncer, as the target's
// user, without TLS and without any other parameter (PgBouncer refuses
// startup parameters it does not know).
func (b *Bouncer) URL(database string) string {
	u := url.URL{Scheme: "postgres", Host: b.Addr(), Path: "/" + database, RawQuery: "sslmode=disable"}
	if b.target.Password != "" {
		u.User = url.UserPassword(b.target.User, b.target.Password)
	} else {
		u.User = url.User(b.target.User)
	}
	return u.String()
}

// Database returns the target's database name (the one in DATABASE_URL).
func (b *Bouncer) Database() string { return b.target.Database }

// PoolConfig returns the configuration of a pgx pool on [Bouncer.URL] of
// database, with mode as its DefaultQueryExecMode: behind transaction
// pooling, a mode without named prepared statements
// (pgx.QueryExecModeExec, QueryExecModeCacheDescribe). It fails the test
// when the URL does not parse.
func (b *Bouncer) PoolConfig(t TB, database string, mode pgx.QueryExecMode) *pgxpool.Config {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(b.URL(database))
	if err != nil {
		t.Fatalf("pgbouncer: pool config: %v", err)
	}
	cfg.ConnConfig.DefaultQueryExecMode = mode
	return cfg
}

// Admin runs command on the admin console (database "pgbouncer": SHOW
// POOLS, SHOW SERVERS, RECONNECT, KILL db, PAUSE, RESUME, ...) and returns
// the rows of its last result, each as text.
func (b *Bouncer) Admin(ctx context.Context, command string) ([][]string, error) {
	conn, err := pgconn.Connect(ctx, b.URL("pgbouncer"))
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: admin console: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	results, err := conn.Exec(ctx, command).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: admin %q: %w", command, err)
	}
	var rows [][]string
	if len(results) > 0 {
		for _, r := range results[len(results)-1].Rows {
			row := make([]string, len(r))
			for i, v := range r {
				row[i] = string(v)
			}
			rows = append(rows, row)
		}
	}
	return rows, nil
}

// Kill stops the process with SIGKILL and waits for it to exit: every
// client and server connection drops; connections to its port are refused
// until [Bouncer.Restart].
func (b *Bouncer) Kill() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.killLocked()
}

// Restart starts the bouncer again (killing it first if it runs) on the
// same port with the same configuration, and waits until it answers.
func (b *Bouncer) Restart() error {
	b.Kill()
	var err error
	for range 50 { // the port may linger for a moment after the kill
		if err = b.start(); err == nil || !errors.Is(err, loopback.ErrAddrInUse) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("pgbouncer: restart %s: %w", b.Addr(), err)
	}
	return nil
}

// Log returns the bouncer's log so far, for failure messages.
func (b *Bouncer) Log() string {
	data, _ := os.ReadFile(filepath.Join(b.dir, "pgbouncer.log"))
	return string(data)
}

// Close kills the bouncer and removes its directory.
func (b *Bouncer) Close() {
	b.Kill()
	os.RemoveAll(b.dir)
}

func (b *Bouncer) killLocked() {
	if b.proc == nil {
		return
	}
	b.proc.Kill()
	b.proc = nil
}

// server is the [databases] connection settings of the target.
func (b *Bouncer) server() string {
	return "host=" + b.target.Host + " port=" + strconv.Itoa(int(b.target.Port))
}

func (b *Bouncer) writeConfig() error {
	var ini strings.Builder
	ini.WriteString("[databases]\n")
	names := make([]string, 0, len(b.opts.Databases))
	for name := range b.opts.Databases {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		extra := b.opts.Databases[name]
		if !strings.Contains(extra, "dbname=") {
			extra = "dbname=" + name + " " + extra
		}
		fmt.Fprintf(&ini, "%s = %s %s\n", name, b.server(), extra)
	}
	fmt.Fprintf(&ini, "* = %s\n", b.server())
	settings := map[string]string{
		"listen_addr":       "127.0.0.1",
		"listen_port":       strconv.Itoa(b.port),
		"unix_socket_dir":   "",
		"auth_type":         "trust",
		"auth_file":         filepath.Join(b.dir, "userlist.txt"),
		"admin_users":       b.target.User,
		"pool_mode":         b.opts.PoolMode,
		"default_pool_size": strconv.Itoa(b.opts.PoolSize),
		"max_client_conn":   "1000",
		"logfile":           filepath.Join(b.dir, "pgbouncer.log"),
		"pidfile":           filepath.Join(b.dir, "pgbouncer.pid"),
		// A server login that failed (the server restarting) is retried
		// at once, not after the default 15s.
		"server_login_retry": "0",
	}
	if len(b.opts.IgnoreStartupParameters) > 0 {
		settings["ignore_startup_parameters"] = strings.Join(b.opts.IgnoreStartupParameters, ",")
	}
	for k, v := range b.opts.Settings {
		settings[k] = v
	}
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	ini.WriteString("[pgbouncer]\n")
	for _, k := range keys {
		fmt.Fprintf(&ini, "%s = %s\n", k, settings[k])
	}
	users := fmt.Sprintf("%q %q\n", b.target.User, b.target.Password)
	files := map[string]string{"pgbouncer.ini": ini.String(), "userlist.txt": users}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(b.dir, name), []byte(content), 0o600); err != nil {
			return err
		}
	}
	return b.chown()
}

// chown gives the directory and its files to the user the process runs as
// when started as root.
func (b *Bouncer) chown() error {
	if b.runAs == nil {
		return nil
	}
	uid, err := strconv.Atoi(b.runAs.Uid)
	if err != nil {
		return err
	}
	gid, err := strconv.Atoi(b.runAs.Gid)
	if err != nil {
		return err
	}
	return filepath.Walk(b.dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
}

func (b *Bouncer) start() error {
	args := []string{filepath.Join(b.dir, "pgbouncer.ini")}
	if b.runAs != nil {
		args = append([]string{"-u", b.runAs.Username}, args...)
	}
	cmd := exec.Command(b.bin, args...)
	cmd.Dir = b.dir
	proc, err := loopback.StartProcess(cmd, loopback.ProcessOptions{
		Name:    "pgbouncer",
		Addr:    b.Addr(),
		Log:     filepath.Join(b.dir, "pgbouncer.log"),
		Poll:    20 * time.Millisecond,
		Timeout: startTimeout,
		Ready: func(pid int) error {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			if err := b.ping(ctx); err != nil {
				return err
			}
			return b.ours(pid)
		},
	})
	if err != nil {
		return err
	}
	b.mu.Lock()
	b.proc = proc
	b.mu.Unlock()
	return nil
}

// ping asks the admin console for the version: PgBouncer answers it
// itself, without a server connection.
func (b *Bouncer) ping(ctx context.Context) error {
	conn, err := pgconn.Connect(ctx, b.URL("pgbouncer"))
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, "SHOW VERSION").ReadAll()
	return err
}

// ours checks that the process answering is the one started: another
// process may hold the port when ours failed to bind it.
func (b *Bouncer) ours(pid int) error {
	data, err := os.ReadFile(filepath.Join(b.dir, "pgbouncer.pid"))
	if err != nil {
		return err
	}
	if got := strings.TrimSpace(string(data)); got != strconv.Itoa(pid) {
		return fmt.Errorf("%s is answered by pid %s, not %d", b.Addr(), got, pid)
	}
	return nil
}
