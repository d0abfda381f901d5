package kubeletbench

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nodevol/nodevol/bench/internal/apiaudit"
)

// fleetVolResources are the resources a node reads, watches or asks for
// because of its pods' volumes: the objects of configMap, secret and
// projected volumes, service-account tokens, claims and their volumes,
// attachments, and the CSI objects. The rest (pods, nodes, leases,
// events, services, discovery...) is the node's other work.
var fleetVolResources = []string{
	"configmaps", "secrets", "serviceaccounts/token",
	"persistentvolumeclaims", "persistentvolumes", "volumeattachments",
	"csidrivers", "csinodes", "storageclasses",
}

// fleetSample is what a phase's figures are differences of.
type fleetSample struct {
	at         time.Time
	apiCPU     time.Duration
	kubeletCPU []time.Duration
	// runtimeCPU is a real runtime's (fleetRealNode.sampled); 0 on the
	// fake one.
	runtimeCPU time.Duration
}

// sampleFleet samples the time and the CPU time of the API server (pid
// api) and of each node's kubelet.
func sampleFleet(b *testing.B, api int, nodes []fleetNode) fleetSample {
	s := fleetSample{at: time.Now()}
	var err error
	if s.apiCPU, err = procCPU(api); err != nil {
		b.Fatal(err)
	}
	for _, n := range nodes {
		cpu, err := procCPU(n.proc.Pid())
		if err != nil {
			b.Fatal(err)
		}
		s.kubeletCPU = append(s.kubeletCPU, cpu)
	}
	return s
}

// clockTick is the kernel's USER_HZ, the unit of /proc/{pid}/stat's times
// (100 on every Linux this runs on).
const clockTick = 10 * time.Millisecond

// procCPU is the CPU time, user and system, that process pid and its
// children it waited for (the kubelet's mount and umount commands) used,
// from /proc/{pid}/stat.
func procCPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("reading process %d's CPU time: %w", pid, err)
	}
	_, rest, ok := strings.Cut(string(data), ") ")
	f := strings.Fields(rest)
	// rest starts at field 3 (state); utime, stime, cutime and cstime
	// are fields 14 to 17.
	if !ok || len(f) < 15 {
		return 0, fmt.Errorf("process %d's stat %q: too short", pid, data)
	}
	var ticks int64
	for _, v := range f[11:15] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("process %d's stat: %w", pid, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * clockTick, nil
}

// procRSS is process pid's VmRSS in bytes.
func procRSS(pid int) (uint64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("reading process %d's status: %w", pid, err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS for process %d", pid)
}

// apiServerPid finds the kube-apiserver serving on port (testenv does not
// export its process).
func apiServerPid(port int) (int, error) {
	flag := fmt.Sprintf("--secure-port=%d", port)
	dirs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		return 0, err
	}
	for _, path := range dirs {
		data, err := os.ReadFile(path)
		if err != nil {
			continue // gone meanwhile
		}
		args := strings.Split(string(data), "\x00")
		if filepath.Base(args[0]) == "kube-apiserver" && slices.Contains(args, flag) {
			return strconv.Atoi(filepath.Base(filepath.Dir(path)))
		}
	}
	return 0, fmt.Errorf("no kube-apiserver with %s", flag)
}

// nodeCounts are the nodes' requests (or watches), by node user.
type nodeCounts map[string]apiaudit.Counts

// countNodes counts users' requests in [from, to) from the audit log.
func countNodes(log string, users []string, from, to time.Time) (nodeCounts, error) {
	all, err := apiaudit.CountUsers(log, from, to)
	if err != nil {
		return nil, err
	}
	return pick(all, users), nil
}

// openWatches are the watches users hold now, from the audit log.
func openWatches(log string, users []string) (nodeCounts, error) {
	all, err := apiaudit.OpenWatches(log)
	if err != nil {
		return nil, err
	}
	return pick(all, users), nil
}

// pick is all's counts of users (empty counts for a user with none).
func pick(all map[string]apiaudit.Counts, users []string) nodeCounts {
	out := nodeCounts{}
	for _, u := range users {
		out[u] = all[u]
		if out[u] == nil {
			out[u] = apiaudit.Counts{}
		}
	}
	return out
}

// mean is the counts by "verb resource" averaged over n nodes.
func (c nodeCounts) mean(n int) map[string]float64 {
	out := map[string]float64{}
	for _, counts := range c {
		for k, v := range counts {
			out[k] += float64(v) / float64(n)
		}
	}
	return out
}

// total and volume are the requests of every node, all of them and those
// of fleetVolResources only.
func (c nodeCounts) total() (all, vol int) {
	for _, counts := range c {
		all += counts.Total()
		vol += counts.Of(fleetVolResources...)
	}
	return all, vol
}

// perNode lists the mean counts, one a line, for a log.
func (c nodeCounts) perNode(n int) string {
	m := c.mean(n)
	var sb strings.Builder
	for _, k := range slices.Sorted(maps.Keys(m)) {
		fmt.Fprintf(&sb, "  %8.1f  %s\n", m[k], k)
	}
	return sb.String()
}
