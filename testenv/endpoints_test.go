package testenv

import (
	"bufio"
	"os"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// TestKubernetesServiceEndpoints checks that the apiserver's kubernetes
// Service controller, which runs every 10 s, reconciles the Service's
// endpoints (the advertise address and the secure port) at the start and again after a restart, and that the apiserver's log has no
// error about endpoints: no "invalid Endpoints" for a loopback address,
// no "stale data" for a reconciler turned off.
func TestKubernetesServiceEndpoints(t *testing.T) {
	env := StartT(t, Options{})
	client := kubernetes.NewForConfigOrDie(env.Config())
	first := waitServiceEndpoints(t, env, client, "")
	if err := env.restartAPIServer(t.Context()); err != nil {
		t.Fatal(err)
	}
	// The stopped apiserver removed its address; the new one puts it back.
	waitServiceEndpoints(t, env, client, first)
	for _, line := range errorLines(t, env.path("kube-apiserver.log")) {
		if strings.Contains(strings.ToLower(line), "endpoints") {
			t.Errorf("the apiserver logged an endpoints error: %s", line)
		}
	}
}

// waitServiceEndpoints waits until the kubernetes Service's endpoints (its
// EndpointSlice, which the apiserver writes with the Endpoints) name the
// advertise address and the apiserver's port, in a version other than
// notVersion, and returns that version.
func waitServiceEndpoints(t *testing.T, env *Env, client kubernetes.Interface, notVersion string) string {
	t.Helper()
	var version string
	waitFor(t, "the kubernetes Service's endpoints", func() bool {
		s, err := client.DiscoveryV1().EndpointSlices(metav1.NamespaceDefault).Get(t.Context(), "kubernetes", metav1.GetOptions{})
		if err != nil || s.ResourceVersion == notVersion || len(s.Endpoints) != 1 || len(s.Ports) != 1 {
			return false
		}
		version = s.ResourceVersion
		port := s.Ports[0]
		return slices.Equal(s.Endpoints[0].Addresses, []string{advertiseAddress}) &&
			port.Port != nil && int(*port.Port) == env.apiPort && port.Name != nil && *port.Name == "https"
	})
	return version
}

// errorLines returns the lines of a klog log at error level.
func errorLines(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "E") {
			lines = append(lines, sc.Text())
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return lines
}
