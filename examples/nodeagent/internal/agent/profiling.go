package agent

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
)

// serveProfiling serves the Go runtime's profiles (net/http/pprof's
// /debug/pprof/) on addr, which must be a loopback address: a heap or CPU
// profile tells more of the process than /metrics does, and is for an
// operator on the node, never for the network. stop shuts the server down
// and waits for the requests being served.
func serveProfiling(ctx context.Context, addr string) (stop func(), err error) {
	if err := checkLoopback(addr); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--profiling-address %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return serveMux(ctx, ln, mux, "/debug/pprof/"), nil
}

// checkLoopback refuses an address whose host is not a loopback IP or
// "localhost" (an empty host, as in ":6060", listens on every interface).
func checkLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--profiling-address %s: %w", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("--profiling-address %s: not a loopback address (127.0.0.1, [::1] or localhost)", addr)
}
