package natstest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"go/build"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Version is the nats-server release the tests run against: the one `make tools`
// installs (NATS_SERVER_VERSION in the Makefile; TestMakefilePinsVersion checks that
// they agree).
const Version = "v2.15.2"

// module is what `go install` builds Version from.
const module = "github.com/nats-io/nats-server/v2"

// startTimeout bounds how long a server may take to say it is ready (a few ms when
// the machine is quiet; seconds beside make test's other phases on 2 cores).
const startTimeout = 30 * time.Second

// stopTimeout bounds a graceful stop before the process is killed.
const stopTimeout = 10 * time.Second

// logTail is how much of a server's log is kept to show when something fails.
const logTail = 16 << 10

// Options is what a test server is configured with; the zero value is a plain server
// without JetStream or authentication.
type Options struct {
	// JetStream turns JetStream on, with its file store in a folder of the test's.
	JetStream bool
	// User and Password, Token, or NKeys (users' public keys) require that
	// authentication of clients; set at most one of them.
	User, Password string
	Token          string
	NKeys          []string
	// TLSCert and TLSKey (PEM files) make the server require TLS.
	TLSCert, TLSKey string
}

// Server is one nats-server process. Its methods are called on the test's goroutine.
type Server struct {
	t    testing.TB
	opts Options
	dir  string // the config file and the JetStream store
	port int    // 0 until the first start; later starts reuse it

	cmd  *exec.Cmd
	log  *tail         // written by the copier goroutine until done is closed
	done chan struct{} // closed when the copier has read the process's output to its end
}

// Start starts a server with o and stops it when the test ends. It fails the test
// when no nats-server binary of Version can be found or installed, or when the server
// does not become ready.
func Start(t testing.TB, o Options) *Server {
	t.Helper()
	s := &Server{t: t, opts: o, dir: t.TempDir()}
	s.start()
	t.Cleanup(s.Stop)
	return s
}

// URL is the server's client URL (nats://127.0.0.1:PORT; with TLS a client still
// dials it as nats:// or tls://).
func (s *Server) URL() string { return "nats://127.0.0.1:" + strconv.Itoa(s.port) }

// Port is the port the server listens on, the same across Restart.
func (s *Server) Port() int { return s.port }

// Restart starts the server again after Stop (stopping it first if it runs), on the
// same port and with the same JetStream store.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	s.start()
}

// Stop stops the server gracefully (SIGTERM; SIGKILL after stopTimeout) and waits for
// the process and its log copier. It is idempotent. When the test has failed, the
// end of the server's log goes to the test log.
func (s *Server) Stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	exited := make(chan struct{})
	timer := time.AfterFunc(stopTimeout, func() {
		select {
		case <-exited:
		default:
			_ = s.cmd.Process.Kill()
		}
	})
	_ = s.cmd.Wait()
	close(exited)
	timer.Stop()
	<-s.done
	if s.t.Failed() {
		s.t.Logf("nats-server log (its end):\n%s", s.log.String())
	}
	s.cmd = nil
}

// start runs the process and waits for its "Server is ready" line.
func (s *Server) start() {
	s.t.Helper()
	bin := Binary(s.t)
	conf := filepath.Join(s.dir, "nats.conf")
	if err := os.WriteFile(conf, []byte(s.config()), 0o600); err != nil {
		s.t.Fatalf("natstest: %v", err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		s.t.Fatalf("natstest: %v", err)
	}
	cmd := exec.Command(bin, "-c", conf)
	cmd.Stdout, cmd.Stderr = w, w
	configure(cmd)
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		s.t.Fatalf("natstest: starting %s: %v", bin, err)
	}
	w.Close()
	s.cmd, s.log, s.done = cmd, &tail{}, make(chan struct{})
	ready := make(chan int, 1)
	go s.copyLog(r, ready)

	timer := time.NewTimer(startTimeout)
	defer timer.Stop()
	select {
	case port := <-ready:
		s.port = port
	case <-s.done:
		s.failStart("exited before it was ready")
	case <-timer.C:
		s.failStart(fmt.Sprintf("not ready after %v", startTimeout))
	}
}

func (s *Server) failStart(why string) {
	s.t.Helper()
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	<-s.done
	s.cmd = nil
	s.t.Fatalf("natstest: nats-server %s; its log:\n%s", why, s.log.String())
}

// copyLog runs on the server's own goroutine: it keeps the end of the process's log,
// sends the client port once the server says it is ready, and closes done at the end
// of the output (when the process has exited).
func (s *Server) copyLog(r *os.File, ready chan<- int) {
	defer close(s.done)
	defer r.Close()
	port, sent := 0, false
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		s.log.add(line)
		if sent {
			continue
		}
		if i := strings.Index(line, listenLine); i >= 0 {
			addr := line[i+len(listenLine):]
			if j := strings.LastIndexByte(addr, ':'); j >= 0 {
				port, _ = strconv.Atoi(strings.TrimSpace(addr[j+1:]))
			}
		}
		if strings.Contains(line, readyLine) && port > 0 {
			ready <- port
			sent = true
		}
	}
}

// The log lines start waits for (nats-server's server/server.go).
const (
	listenLine = "Listening for client connections on "
	readyLine  = "Server is ready"
)

// config is the server's configuration file.
func (s *Server) config() string {
	var b strings.Builder
	port := s.port
	if port == 0 {
		port = -1 // any free port
	}
	fmt.Fprintf(&b, "listen: %q\n", "127.0.0.1:"+strconv.Itoa(port))
	if s.opts.JetStream {
		fmt.Fprintf(&b, "jetstream { store_dir: %q }\n", filepath.Join(s.dir, "store"))
	}
	o := s.opts
	switch {
	case o.User != "":
		fmt.Fprintf(&b, "authorization { user: %q, password: %q }\n", o.User, o.Password)
	case o.Token != "":
		fmt.Fprintf(&b, "authorization { token: %q }\n", o.Token)
	case len(o.NKeys) > 0:
		b.WriteString("authorization { users: [\n")
		for _, k := range o.NKeys {
			fmt.Fprintf(&b, "  { nkey: %q }\n", k)
		}
		b.WriteString("] }\n")
	}
	if o.TLSCert != "" {
		fmt.Fprintf(&b, "tls { cert_file: %q, key_file: %q }\n", o.TLSCert, o.TLSKey)
	}
	return b.String()
}

// tail keeps the last logTail bytes of a log, whole lines; safe for one writer and
// readers after the writer is done (Stop and failStart read it after done).
type tail struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (t *tail) add(line string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf.WriteString(line)
	t.buf.WriteByte('\n')
	if t.buf.Len() > 2*logTail {
		keep := t.buf.Bytes()[t.buf.Len()-logTail:]
		if i := bytes.IndexByte(keep, '\n'); i >= 0 {
			keep = keep[i+1:]
		}
		t.buf = *bytes.NewBuffer(append([]byte(nil), keep...))
	}
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.buf.String()
}

// binary is Binary's answer, found once per process.
var binary struct {
	once sync.Once
	path string
	err  error
}

// Binary returns the path of a nats-server binary of Version (see the package doc for
// where it looks), installing it into the user's cache folder on first use when none
// is found. It fails the test when that is impossible.
func Binary(t testing.TB) string {
	t.Helper()
	binary.once.Do(func() { binary.path, binary.err = find() })
	if binary.err != nil {
		t.Fatalf("natstest: %v", binary.err)
	}
	return binary.path
}

func find() (string, error) {
	if p := os.Getenv("KVINDEX_NATS_SERVER"); p != "" {
		if err := checkVersion(p); err != nil {
			return "", fmt.Errorf("KVINDEX_NATS_SERVER=%s: %w", p, err)
		}
		return p, nil
	}
	var candidates []string
	if gobin := os.Getenv("GOBIN"); gobin != "" {
		candidates = append(candidates, filepath.Join(gobin, "nats-server"))
	}
	for _, gp := range filepath.SplitList(build.Default.GOPATH) {
		candidates = append(candidates, filepath.Join(gp, "bin", "nats-server"))
	}
	if p, err := exec.LookPath("nats-server"); err == nil {
		candidates = append(candidates, p)
	}
	for _, c := range candidates {
		if checkVersion(c) == nil {
			return c, nil
		}
	}
	return install()
}

// checkVersion runs p --version and compares it with Version.
func checkVersion(p string) error {
	out, err := exec.Command(p, "--version").Output()
	if err != nil {
		return err
	}
	if got, want := strings.TrimSpace(string(out)), "nats-server: "+Version; got != want {
		return fmt.Errorf("reports %q, want %q", got, want)
	}
	return nil
}

// install builds Version into the user's cache folder (once: later processes find it
// there). Concurrent test processes each build into a folder of their own and rename
// the binary into place, which is atomic.
func install() (string, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no nats-server %s found and no cache folder to install it into (%w); run make tools", Version, err)
	}
	dir := filepath.Join(cache, "kvindex", "nats-server-"+Version)
	final := filepath.Join(dir, "nats-server")
	if checkVersion(final) == nil {
		return final, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(dir, "install-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	goTool, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("no nats-server %s found, and no go command to install it (%w); run make tools", Version, err)
	}
	cmd := exec.Command(goTool, "install", module+"@"+Version)
	cmd.Env = append(os.Environ(), "GOBIN="+tmp, "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("installing nats-server %s (make tools installs it into GOPATH/bin): %w\n%s", Version, err, out)
	}
	if err := os.Rename(filepath.Join(tmp, "nats-server"), final); err != nil && !errors.Is(err, os.ErrExist) {
		return "", err
	}
	return final, checkVersion(final)
}
