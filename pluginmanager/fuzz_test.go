package pluginmanager

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/nodevol/nodevol/csi"
	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/registration"
)

// fuzzRegistrar serves the registration service on one socket for the
// whole fuzzing run: GetInfo answers whatever the current input says, and
// NotifyRegistrationStatus calls are recorded.
type fuzzRegistrar struct {
	registerapi.UnimplementedRegistrationServer

	mu       sync.Mutex
	info     *registerapi.PluginInfo
	statuses []*registerapi.RegistrationStatus
}

func (r *fuzzRegistrar) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.info, nil
}

func (r *fuzzRegistrar) NotifyRegistrationStatus(_ context.Context, s *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.statuses = append(r.statuses, s)
	return &registerapi.RegistrationStatusResponse{}, nil
}

// set installs the next answer and forgets the statuses.
func (r *fuzzRegistrar) set(info *registerapi.PluginInfo) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.info, r.statuses = info, nil
}

func (r *fuzzRegistrar) took() []*registerapi.RegistrationStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.statuses)
}

// fuzzHandler validates with the CSI registration handler (real rules, no
// API, no driver) and records calls; RegisterPlugin succeeds or fails as
// the input says, without dialing.
type fuzzHandler struct {
	csi         *registration.Handler
	failReg     bool
	calls       []string
	gotName     string
	gotEndpoint string
	gotVersions []string
}

func (h *fuzzHandler) ValidatePlugin(ctx context.Context, name, endpoint string, versions []string) error {
	h.calls = append(h.calls, "validate")
	h.gotName, h.gotEndpoint, h.gotVersions = name, endpoint, slices.Clone(versions)
	return h.csi.ValidatePlugin(ctx, name, endpoint, versions)
}

func (h *fuzzHandler) RegisterPlugin(_ context.Context, name, endpoint string, versions []string) error {
	h.calls = append(h.calls, "register")
	if name != h.gotName || endpoint != h.gotEndpoint || !slices.Equal(versions, h.gotVersions) {
		return errors.New("RegisterPlugin got another answer than ValidatePlugin")
	}
	if h.failReg {
		return errors.New("injected failure")
	}
	return nil
}

func (h *fuzzHandler) DeRegisterPlugin(context.Context, string, string) error {
	h.calls = append(h.calls, "deregister")
	return nil
}

// utf8All reports whether every string is valid UTF-8 (what protobuf can
// carry).
func utf8All(ss ...string) bool {
	for _, s := range ss {
		if !utf8.ValidString(s) {
			return false
		}
	}
	return true
}

// FuzzRegister feeds the manager's registration of a socket (register:
// dial, GetInfo, handler, NotifyRegistrationStatus) any GetInfo answer —
// type, name, endpoint, versions (split on commas) — from a registrar
// served once for the whole run, with handlers for "CSIPlugin" (the CSI
// handler's validation) and "DevicePlugin" (registration fails). It checks
// that it never panics and that:
//   - an answer protobuf cannot carry (invalid UTF-8) or without a type
//     fails before any handler runs, and the registrar is not told;
//   - a type without a handler fails naming the type and no handler runs;
//   - otherwise the type's handler validates exactly the answer (the
//     endpoint defaulting to the socket path), registers only after a
//     successful validation and with the same answer; the plugin is
//     registered (PluginInfo equal to the answer) exactly when both
//     succeed, and only with a valid CSI driver name, a non-empty endpoint
//     and a 1.x version;
//   - every error names the socket; once the answer was read, the
//     registrar hears exactly one status: registered, or not with the
//     reason (the error without the socket prefix).
func FuzzRegister(f *testing.F) {
	f.Add(registerapi.CSIPlugin, "csi.example.com", "/csi/csi.sock", "1.0.0", false)
	f.Add(registerapi.CSIPlugin, "csi.example.com", "", "1.0.0,1.2.0", false)
	f.Add(registerapi.CSIPlugin, "csi.example.com", "/csi/csi.sock", "1.0.0", true)
	f.Add(registerapi.CSIPlugin, "csi.example.com", "/csi/csi.sock", "0.3.0,2.0.0", false)
	f.Add(registerapi.CSIPlugin, "csi.example.com", "/csi/csi.sock", "", false)
	f.Add(registerapi.CSIPlugin, "../x", "/csi/csi.sock", "1.0.0", false)
	f.Add(registerapi.CSIPlugin, "", "/csi/csi.sock", "1.0.0", false)
	f.Add(registerapi.CSIPlugin, "\u212a.example.com", "/csi/csi.sock", "1.0.0", false)
	f.Add(registerapi.CSIPlugin, "\xff", "/csi/csi.sock", "1.0.0", false)
	f.Add(registerapi.CSIPlugin, "csi.example.com", "\xff", "1.0.0", false)
	f.Add(registerapi.CSIPlugin, "csi.example.com", "/csi/csi.sock", "1.0.0,\xff", false)
	f.Add(registerapi.CSIPlugin, strings.Repeat("a", 4096), strings.Repeat("/", 4096), strings.Repeat("1.0,", 1024), false)
	f.Add(registerapi.DevicePlugin, "device.example.com", "/dp.sock", "v1beta1", false)
	f.Add("", "csi.example.com", "/csi/csi.sock", "1.0.0", false)
	f.Add("CSIPLUGIN", "csi.example.com", "/csi/csi.sock", "1.0.0", false)
	f.Add("\xff", "csi.example.com", "/csi/csi.sock", "1.0.0", false)

	dir := csitest.SocketDir(f)
	sock := filepath.Join(dir, "reg.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		f.Fatal(err)
	}
	reg := &fuzzRegistrar{}
	srv := grpc.NewServer()
	registerapi.RegisterRegistrationServer(srv, reg)
	go func() { _ = srv.Serve(lis) }()
	f.Cleanup(srv.Stop)

	csiReg := csi.NewRegistry(csi.RegistryOptions{})
	f.Cleanup(func() { csiReg.Close() })
	csiHandler := &fuzzHandler{}
	devHandler := &fuzzHandler{failReg: true}
	m, err := New(Options{Dir: dir, RPCTimeout: 10 * time.Second, Handlers: map[string]Handler{
		registerapi.CSIPlugin: csiHandler, registerapi.DevicePlugin: devHandler}})
	if err != nil {
		f.Fatal(err)
	}
	ctx := klog.NewContext(context.Background(), klog.Background().V(10)) // quiet

	f.Fuzz(func(t *testing.T, typ, name, endpoint, versionList string, failReg bool) {
		var versions []string
		if versionList != "" {
			versions = strings.Split(versionList, ",")
		}
		reg.set(&registerapi.PluginInfo{Type: typ, Name: name, Endpoint: endpoint, SupportedVersions: versions})
		for _, h := range []*fuzzHandler{csiHandler, devHandler} {
			csi, err := registration.New(registration.Config{Registry: csiReg})
			if err != nil {
				t.Fatal(err)
			}
			h.csi, h.calls, h.gotName, h.gotEndpoint, h.gotVersions = csi, nil, "", "", nil
		}
		csiHandler.failReg = failReg

		out := m.register(ctx, sock, 7)
		if out.then != nil {
			out.then() // NotifyRegistrationStatus, as the operation's goroutine does
		}
		statuses := reg.took()

		if out.path != sock || out.gen != 7 || out.dereg {
			t.Fatalf("outcome %+v for socket %s generation 7", out, sock)
		}
		if out.err != nil && !strings.Contains(out.err.Error(), sock) {
			t.Fatalf("error %q does not name the socket %s", out.err, sock)
		}
		if (out.err == nil) == (out.plugin == nil) {
			t.Fatalf("outcome has error %v and plugin %+v", out.err, out.plugin)
		}
		var h *fuzzHandler
		switch typ {
		case registerapi.CSIPlugin:
			h = csiHandler
		case registerapi.DevicePlugin:
			h = devHandler
		}
		for _, other := range []*fuzzHandler{csiHandler, devHandler} {
			if other != h && len(other.calls) > 0 {
				t.Fatalf("type %q: the handler of another type was called: %q", typ, other.calls)
			}
		}

		if !utf8All(append([]string{typ, name, endpoint}, versions...)...) || typ == "" {
			if out.err == nil || (h != nil && len(h.calls) > 0) || len(statuses) != 0 {
				t.Fatalf("answer %q %q %q %q: error %v, handler calls %v, statuses %v; want an error before any handler, no status",
					typ, name, endpoint, versions, out.err, h, statuses)
			}
			return
		}
		if len(statuses) != 1 {
			t.Fatalf("registrar heard %d statuses, want 1: %v", len(statuses), statuses)
		}
		st := statuses[0]
		if st.PluginRegistered != (out.err == nil) || (out.err != nil && (st.Error == "" || !strings.HasSuffix(out.err.Error(), st.Error))) ||
			(out.err == nil && st.Error != "") {
			t.Fatalf("registrar heard %+v for outcome error %v", st, out.err)
		}
		if h == nil {
			if out.err == nil || !strings.Contains(out.err.Error(), "no handler for plugin type") {
				t.Fatalf("type %q without a handler: error %v", typ, out.err)
			}
			return
		}

		wantEndpoint := endpoint
		if wantEndpoint == "" {
			wantEndpoint = sock
		}
		if len(h.calls) == 0 || h.calls[0] != "validate" || h.gotName != name || h.gotEndpoint != wantEndpoint || !slices.Equal(h.gotVersions, versions) {
			t.Fatalf("handler calls %q with %q %q %q, want validate of %q %q %q", h.calls, h.gotName, h.gotEndpoint, h.gotVersions, name, wantEndpoint, versions)
		}
		_, versionErr := registration.HighestSupportedVersion(versions)
		valid := csi.ValidateDriverName(name) == nil && versionErr == nil
		wantCalls := []string{"validate"}
		if valid {
			wantCalls = append(wantCalls, "register")
		}
		if !slices.Equal(h.calls, wantCalls) {
			t.Fatalf("handler calls %q, want %q (answer valid: %v)", h.calls, wantCalls, valid)
		}
		if registered := valid && !h.failReg; registered != (out.err == nil) {
			t.Fatalf("answer %q %q %q %q (valid %v, register fails %v): error %v", typ, name, endpoint, versions, valid, h.failReg, out.err)
		}
		if out.plugin != nil {
			p := out.plugin.info
			if p.SocketPath != sock || p.Type != typ || p.Name != name || p.Endpoint != wantEndpoint || !slices.Equal(p.Versions, versions) ||
				p.RegisteredAt.IsZero() || out.plugin.gen != 7 || out.plugin.handler != Handler(h) {
				t.Fatalf("registered %+v (gen %d) for answer %q %q %q %q", p, out.plugin.gen, typ, name, endpoint, versions)
			}
		}
	})
}
