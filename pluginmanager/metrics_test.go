package pluginmanager

import (
	"fmt"
	"net"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodevol/nodevol/csiplugin/csitest"
)

// TestTotalPluginsMetric: plugin_manager_total_plugins has, as the
// kubelet's, one series per socket found (desired_state_of_world) and per
// registered plugin (actual_state_of_world), labelled by socket path; a
// socket that cannot be registered is desired only; a removed one goes.
func TestTotalPluginsMetric(t *testing.T) {
	dir := tempDir(t)
	reg := prometheus.NewRegistry()
	m := startManager(t, dir, &fakeHandler{}, Options{Registerer: reg})
	r := startRegistrar(t, csitest.RegistrarConfig{Dir: dir, DriverName: "a.example.com", Endpoint: "/csi/a.sock", Versions: []string{"1.2.0"}})
	if s := waitStatus(t, r, 1); !s.Registered {
		t.Fatalf("status = %+v, want registered", s)
	}
	// A socket that answers no GetInfo: found, never registered.
	dead := filepath.Join(dir, "dead.sock")
	l, err := net.Listen("unix", dead)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	lines := []string{
		fmt.Sprintf("actual_state_of_world %s 1", r.SocketPath()),
		fmt.Sprintf("desired_state_of_world %s 1", dead),
		fmt.Sprintf("desired_state_of_world %s 1", r.SocketPath()),
	}
	sort.Strings(lines)
	want := strings.Join(lines, "\n")
	waitFor(t, "the dead socket found", func() bool { return pluginSamples(t, reg) == want })

	r.Stop()
	waitFor(t, "plugin deregistered", func() bool { return len(m.Plugins()) == 0 })
	want = fmt.Sprintf("desired_state_of_world %s 1", dead)
	if got := pluginSamples(t, reg); got != want {
		t.Errorf("after the registrar went:\n%s\nwant\n%s", got, want)
	}
}

// pluginSamples returns plugin_manager_total_plugins as sorted lines
// "state socket_path value".
func pluginSamples(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, f := range fams {
		if f.GetName() != "plugin_manager_total_plugins" {
			continue
		}
		for _, s := range f.GetMetric() {
			l := map[string]string{}
			for _, p := range s.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			lines = append(lines, fmt.Sprintf("%s %s %g", l["state"], l["socket_path"], s.GetGauge().GetValue()))
		}
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}
