// Command pause is a pod sandbox's first process, for the pause image that
// package realnode builds: it holds the pod's namespaces, reaps the
// children that a shared PID namespace hands it, and exits on SIGINT or
// SIGTERM. It does what registry.k8s.io/pause does, in Go, so that the
// image is built here from source instead of pulled.
package main

import (
	"os"
	"os/signal"

	"golang.org/x/sys/unix"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, unix.SIGINT, unix.SIGTERM, unix.SIGCHLD)
	for sig := range sigs {
		if sig != unix.SIGCHLD {
			os.Exit(0)
		}
		// Reap every child that has exited: as PID 1 of a shared PID
		// namespace, the pod's orphans are ours.
		for {
			var ws unix.WaitStatus
			if pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
}
