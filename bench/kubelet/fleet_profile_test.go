package kubeletbench

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"time"
)

// profile starts a CPU profile (-fleet.profile long; none when 0) of
// each kubelet, from its server's /debug/pprof/profile, and returns a
// function that waits for them and saves each in -fleet.dir as
// fleet-<nodes>x<pods>-run<r>-<side>-<phase>-<node>.pprof.
func (r *fleetRun) profile(phase string) func() error {
	if *fleetProfile <= 0 {
		return func() error { return nil }
	}
	var wg sync.WaitGroup
	errs := make([]error, len(r.nodes))
	for i, n := range r.nodes {
		name := fmt.Sprintf("fleet-%dx%d-run%d-%s-%s-%s.pprof", r.spec.nodes, r.spec.pods, r.spec.run, r.spec.side, phase, n.name)
		wg.Go(func() { errs[i] = fetchProfile(r.b.Context(), n.config, filepath.Join(*fleetDir, name), *fleetProfile) })
	}
	return func() error {
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				return err
			}
		}
		return nil
	}
}

var portLine = regexp.MustCompile(`(?m)^port: (\d+)$`)

// fetchProfile saves a CPU profile of d of the kubelet configured by
// config at path.
func fetchProfile(ctx context.Context, config, path string, d time.Duration) error {
	data, err := os.ReadFile(config)
	if err != nil {
		return fmt.Errorf("the kubelet's port: %w", err)
	}
	m := portLine.FindSubmatch(data)
	if m == nil {
		return fmt.Errorf("no port in %s", config)
	}
	url := fmt.Sprintf("https://127.0.0.1:%s/debug/pprof/profile?seconds=%d", m[1], int(d.Seconds()))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	// The kubelet's serving certificate is its own self-signed one.
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // a test's own kubelet
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("profiling the kubelet: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("profiling the kubelet: %s: %s", resp.Status, body)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return fmt.Errorf("saving the profile: %w", err)
	}
	return f.Close()
}
