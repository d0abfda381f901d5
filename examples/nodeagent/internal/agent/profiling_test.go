package agent

import (
	"net/http"
	"strings"
	"testing"
)

// TestServeProfiling: --profiling-address serves the runtime's profiles
// on a loopback address and refuses any other.
func TestServeProfiling(t *testing.T) {
	for _, tt := range []struct {
		addr    string
		wantErr string
	}{
		{addr: "127.0.0.1:0"},
		{addr: "localhost:0"},
		{addr: ":0", wantErr: "not a loopback address"},
		{addr: "0.0.0.0:0", wantErr: "not a loopback address"},
		{addr: "192.0.2.1:6060", wantErr: "not a loopback address"},
		{addr: "127.0.0.1", wantErr: "missing port"},
	} {
		t.Run(tt.addr, func(t *testing.T) {
			ctx, logged := loggingContext()
			stop, err := serveProfiling(ctx, tt.addr)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("serveProfiling(%q) error %v, want one with %q", tt.addr, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer stop()
			code, body := get(t, "http://"+loggedAddress(t, logged.String())+"/debug/pprof/heap?debug=1")
			if code != http.StatusOK || !strings.Contains(body, "heap profile:") {
				t.Errorf("/debug/pprof/heap = %d, want 200 and a heap profile:\n%.300s", code, body)
			}
		})
	}
}

// TestProfilingOffByDefault: without --profiling-address there is no
// profiling endpoint.
func TestProfilingOffByDefault(t *testing.T) {
	var o options
	if err := newFlagSet(&o).Parse(nil); err != nil {
		t.Fatal(err)
	}
	if o.profilingAddress != "" {
		t.Errorf("--profiling-address defaults to %q, want none", o.profilingAddress)
	}
}
