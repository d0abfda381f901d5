package pluginmanager

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/nodevol/nodevol/csiplugin/csitest"
)

// fakeHandler records calls; RegisterPlugin fails failRegister times first.
type fakeHandler struct {
	mu           sync.Mutex
	failRegister int
	validateErr  error
	calls        []string
	registered   map[string]string // name -> endpoint
	onRegister   func(name string)
}

var _ Handler = (*fakeHandler)(nil)

func (h *fakeHandler) record(call string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls = append(h.calls, call)
}

func (h *fakeHandler) ValidatePlugin(_ context.Context, name, _ string, _ []string) error {
	h.record("validate " + name)
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.validateErr
}

func (h *fakeHandler) RegisterPlugin(_ context.Context, name, endpoint string, _ []string) error {
	h.record("register " + name)
	h.mu.Lock()
	if h.failRegister > 0 {
		h.failRegister--
		h.mu.Unlock()
		return errors.New("injected failure")
	}
	if h.registered == nil {
		h.registered = map[string]string{}
	}
	h.registered[name] = endpoint
	f := h.onRegister
	h.mu.Unlock()
	if f != nil {
		f(name)
	}
	return nil
}

func (h *fakeHandler) DeRegisterPlugin(_ context.Context, name, _ string) error {
	h.record("deregister " + name)
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.registered, name)
	return nil
}

func (h *fakeHandler) Calls() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.calls)
}

func (h *fakeHandler) count(call string) int {
	n := 0
	for _, c := range h.Calls() {
		if c == call {
			n++
		}
	}
	return n
}

// tempDir returns a registration directory (not made yet) in a
// csitest.SocketDir: the tests bind sockets in it and below it.
func tempDir(t testing.TB) string {
	return filepath.Join(csitest.SocketDir(t), "plugins_registry")
}

// startManager runs a manager on dir until the test ends.
func startManager(t testing.TB, dir string, h Handler, opts Options) *Manager {
	t.Helper()
	opts.Dir = dir
	if opts.Handlers == nil {
		opts.Handlers = map[string]Handler{registerapi.CSIPlugin: h}
	}
	if opts.InitialBackoff == 0 {
		opts.InitialBackoff = 10 * time.Millisecond
	}
	if opts.MaxBackoff == 0 {
		opts.MaxBackoff = 50 * time.Millisecond
	}
	if opts.RPCTimeout == 0 {
		opts.RPCTimeout = 5 * time.Second
	}
	m, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	var ctx context.Context
	if tt, ok := t.(*testing.T); ok {
		_, ctx = ktesting.NewTestContext(tt)
	} else {
		ctx = context.Background()
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Run returned %v, want context.Canceled", err)
		}
	})
	// Run creates the directory; wait for it so that tests can put files in.
	waitFor(t, "registration directory", func() bool { _, err := os.Stat(dir); return err == nil })
	return m
}

// waitFor polls cond until it holds or 20 s pass.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func startRegistrar(t testing.TB, cfg csitest.RegistrarConfig) *csitest.Registrar {
	t.Helper()
	r, err := csitest.StartRegistrar(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	return r
}

func waitStatus(t testing.TB, r *csitest.Registrar, n int) csitest.RegistrarStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := r.WaitForStatus(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func pluginNames(m *Manager) []string {
	var names []string
	for _, p := range m.Plugins() {
		names = append(names, p.Name)
	}
	return names
}

func TestRegisterAndDeregister(t *testing.T) {
	dir := tempDir(t)
	h := &fakeHandler{}
	m := startManager(t, dir, h, Options{})
	r := startRegistrar(t, csitest.RegistrarConfig{Dir: dir, DriverName: "a.example.com", Endpoint: "/csi/a.sock", Versions: []string{"1.2.0"}})

	if s := waitStatus(t, r, 1); !s.Registered {
		t.Fatalf("status = %+v, want registered", s)
	}
	plugins := m.Plugins()
	if len(plugins) != 1 {
		t.Fatalf("Plugins() = %+v, want one", plugins)
	}
	p := plugins[0]
	if p.Name != "a.example.com" || p.Endpoint != "/csi/a.sock" || p.SocketPath != r.SocketPath() ||
		p.Type != registerapi.CSIPlugin || !slices.Equal(p.Versions, []string{"1.2.0"}) || p.RegisteredAt.IsZero() {
		t.Errorf("plugin = %+v", p)
	}
	if got, want := h.Calls(), []string{"validate a.example.com", "register a.example.com"}; !slices.Equal(got, want) {
		t.Errorf("calls = %q, want %q", got, want)
	}

	r.Stop()
	waitFor(t, "deregistration", func() bool { return h.count("deregister a.example.com") == 1 })
	waitFor(t, "empty Plugins()", func() bool { return len(m.Plugins()) == 0 })
}

func TestReRegistration(t *testing.T) {
	dir := tempDir(t)
	h := &fakeHandler{}
	m := startManager(t, dir, h, Options{})
	cfg := csitest.RegistrarConfig{Dir: dir, DriverName: "a.example.com"}
	r := startRegistrar(t, cfg)
	waitStatus(t, r, 1)
	// A registrar restart: the socket is created again.
	r.Stop()
	r2 := startRegistrar(t, cfg)
	if s := waitStatus(t, r2, 1); !s.Registered {
		t.Fatalf("status = %+v, want registered", s)
	}
	want := []string{"validate a.example.com", "register a.example.com", "deregister a.example.com",
		"validate a.example.com", "register a.example.com"}
	if got := h.Calls(); !slices.Equal(got, want) {
		t.Errorf("calls = %q, want %q", got, want)
	}
	if got := pluginNames(m); !slices.Equal(got, []string{"a.example.com"}) {
		t.Errorf("plugins = %q", got)
	}
	if p := m.Plugins()[0]; p.Endpoint != r2.SocketPath() {
		t.Errorf("endpoint = %q, want the socket path %q when GetInfo has none", p.Endpoint, r2.SocketPath())
	}
}

func TestExistingSocketsAtStart(t *testing.T) {
	dir := tempDir(t)
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o750); err != nil {
		t.Fatal(err)
	}
	r1 := startRegistrar(t, csitest.RegistrarConfig{Dir: dir, DriverName: "a.example.com"})
	r2 := startRegistrar(t, csitest.RegistrarConfig{Dir: filepath.Join(dir, "sub"), DriverName: "b.example.com"})
	h := &fakeHandler{}
	m := startManager(t, dir, h, Options{})
	waitStatus(t, r1, 1)
	waitStatus(t, r2, 1)
	if got := pluginNames(m); len(got) != 2 {
		t.Errorf("plugins = %q, want two", got)
	}
}

func TestSubdirectoryCreatedLater(t *testing.T) {
	dir := tempDir(t)
	h := &fakeHandler{}
	m := startManager(t, dir, h, Options{})
	sub := filepath.Join(dir, "sub", "deeper")
	if err := os.MkdirAll(sub, 0o750); err != nil {
		t.Fatal(err)
	}
	// The watch on the new directories is added when their events arrive;
	// a socket created before that is found by the walk that adds them.
	r := startRegistrar(t, csitest.RegistrarConfig{Dir: sub, DriverName: "a.example.com"})
	waitStatus(t, r, 1)
	if err := os.RemoveAll(filepath.Join(dir, "sub")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "deregistration", func() bool { return len(m.Plugins()) == 0 })
}

func TestIgnoresHiddenAndNonSockets(t *testing.T) {
	dir := tempDir(t)
	h := &fakeHandler{}
	m := startManager(t, dir, h, Options{})
	hidden := startRegistrar(t, csitest.RegistrarConfig{Dir: dir, DriverName: "hidden.example.com", SocketName: ".hidden-reg.sock"})
	if err := os.WriteFile(filepath.Join(dir, "file-reg.sock"), []byte("not a socket"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(hidden.SocketPath(), filepath.Join(dir, "link-reg.sock")); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, ".hiddendir"), 0o750); err != nil {
		t.Fatal(err)
	}
	inHidden := startRegistrar(t, csitest.RegistrarConfig{Dir: filepath.Join(dir, ".hiddendir"), DriverName: "c.example.com"})
	// A plugin registered after the others shows their events were handled.
	r := startRegistrar(t, csitest.RegistrarConfig{Dir: dir, DriverName: "a.example.com"})
	waitStatus(t, r, 1)
	m.rescanForTest(t)
	if got := pluginNames(m); !slices.Equal(got, []string{"a.example.com"}) {
		t.Errorf("plugins = %q, want only a.example.com", got)
	}
	if n := hidden.GetInfoCalls() + inHidden.GetInfoCalls(); n != 0 {
		t.Errorf("hidden sockets got %d GetInfo calls", n)
	}
}

// rescanForTest runs a resync through the loop (by a fake event) and
// waits until the loop has handled it.
func (m *Manager) rescanForTest(t *testing.T) {
	t.Helper()
	dir := filepath.Join(m.opts.Dir, "sync-"+strings.ReplaceAll(t.Name(), "/", "_"))
	if err := os.Mkdir(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	r := startRegistrar(t, csitest.RegistrarConfig{Dir: dir, DriverName: "sync.example.com"})
	waitStatus(t, r, 1)
	r.Stop()
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "sync plugin gone", func() bool { return !slices.Contains(pluginNames(m), "sync.example.com") })
}

func TestWrongPluginType(t *testing.T) {
	dir := tempDir(t)
	h := &fakeHandler{}
	startManager(t, dir, h, Options{})
	r := startRegistrar(t, csitest.RegistrarConfig{Dir: dir, DriverName: "dev.example.com", Type: registerapi.DevicePlugin})
	s := waitStatus(t, r, 1)
	if s.Registered || !strings.Contains(s.Error, `no handler for plugin type "DevicePlugin"`) {
		t.Errorf("status = %+v, want a refusal naming the type", s)
	}
	if len(h.Calls()) != 0 {
		t.Errorf("handler called: %q", h.Calls())
	}
}

func TestValidationRefusalReported(t *testing.T) {
	dir := tempDir(t)
	h := &fakeHandler{validateErr: errors.New("bad name")}
	m := startManager(t, dir, h, Options{})
	r := startRegistrar(t, csitest.RegistrarConfig{Dir: dir, DriverName: "../x", SocketName: "x-reg.sock"})
	s := waitStatus(t, r, 1)
	if s.Registered || !strings.Contains(s.Error, "bad name") {
		t.Errorf("status = %+v, want the handler's refusal", s)
	}
	if h.count("register ../x") != 0 || len(m.Plugins()) != 0 {
		t.Errorf("refused plugin registered: calls %q", h.Calls())
	}
}

func TestHandlerFailureRetried(t *testing.T) {
	dir := tempDir(t)
	h := &fakeHandler{failRegister: 3}
	m := startManager(t, dir, h, Options{})
	r := startRegistrar(t, csitest.RegistrarConfig{Dir: dir, DriverName: "a.example.com"})
	for i := 1; i <= 3; i++ {
		if s := waitStatus(t, r, i); s.Registered || !strings.Contains(s.Error, "injected failure") {
			t.Errorf("status %d = %+v, want the failure", i, s)
		}
	}
	if s := waitStatus(t, r, 4); !s.Registered {
		t.Errorf("status 4 = %+v, want registered", s)
	}
	if got := pluginNames(m); !slices.Equal(got, []string{"a.example.com"}) {
		t.Errorf("plugins = %q", got)
	}
}

func TestRetryWaitsForBackoff(t *testing.T) {
	dir := tempDir(t)
	clk := testingclock.NewFakeClock(time.Now())
	h := &fakeHandler{failRegister: 1}
	startManager(t, dir, h, Options{Clock: clk, InitialBackoff: time.Minute, MaxBackoff: time.Hour})
	r := startRegistrar(t, csitest.RegistrarConfig{Dir: dir, DriverName: "a.example.com"})
	waitStatus(t, r, 1)
	// The resync ticker is one waiter; the retry timer makes two.
	waitFor(t, "retry timer", func() bool { return clk.Waiters() == 2 })
	clk.Step(time.Minute - time.Millisecond)
	if clk.Waiters() != 2 || r.GetInfoCalls() != 1 {
		t.Fatalf("retried before the backoff expired: waiters %d, GetInfo calls %d", clk.Waiters(), r.GetInfoCalls())
	}
	clk.Step(time.Millisecond)
	if s := waitStatus(t, r, 2); !s.Registered {
		t.Errorf("status after backoff = %+v, want registered", s)
	}
}

// listen creates a unix socket at path served by serve until the test
// ends, when the listener and every accepted connection are closed. It
// returns the number of connections accepted so far.
func listen(t *testing.T, path string, serve func(net.Conn)) func() int {
	t.Helper()
	lis, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	t.Cleanup(func() {
		lis.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() { defer wg.Done(); serve(c) }()
		}
	}()
	return func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(conns)
	}
}

func TestBadSocketsDoNotDisturbOthers(t *testing.T) {
	dir := tempDir(t)
	h := &fakeHandler{}
	m := startManager(t, dir, h, Options{RPCTimeout: 300 * time.Millisecond})
	// Accepts and never says anything.
	silent := listen(t, filepath.Join(dir, "silent-reg.sock"), func(c net.Conn) {
		_, _ = io.Copy(io.Discard, c)
	})
	// Not gRPC: writes garbage and hangs up.
	garbage := listen(t, filepath.Join(dir, "garbage-reg.sock"), func(c net.Conn) {
		fmt.Fprintf(c, "HTTP/1.0 400 nope\r\n\r\n")
		c.Close()
	})
	r := startRegistrar(t, csitest.RegistrarConfig{Dir: dir, DriverName: "a.example.com"})
	waitStatus(t, r, 1)
	// Each bad socket is tried again after its GetInfo failed.
	waitFor(t, "retries of the silent socket", func() bool { return silent() >= 2 })
	waitFor(t, "retries of the garbage socket", func() bool { return garbage() >= 2 })
	// Registered plugins are undisturbed and new ones still register.
	r2 := startRegistrar(t, csitest.RegistrarConfig{Dir: dir, DriverName: "b.example.com"})
	waitStatus(t, r2, 1)
	if got := pluginNames(m); len(got) != 2 {
		t.Errorf("plugins = %q, want a and b", got)
	}
	if len(h.Calls()) != 4 {
		t.Errorf("handler calls = %q, want validate and register of a and b", h.Calls())
	}
}

func TestSocketRemovedDuringRegistration(t *testing.T) {
	dir := tempDir(t)
	h := &fakeHandler{}
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	h.onRegister = func(string) {
		started <- struct{}{}
		<-release
	}
	m := startManager(t, dir, h, Options{})
	r := startRegistrar(t, csitest.RegistrarConfig{Dir: dir, DriverName: "a.example.com"})
	<-started
	r.Stop()
	close(release)
	// The registration completed, the socket is gone: deregistered.
	waitFor(t, "deregistration", func() bool { return h.count("deregister a.example.com") == 1 })
	waitFor(t, "empty Plugins()", func() bool { return len(m.Plugins()) == 0 })
}
