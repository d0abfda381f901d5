package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nodevol/nodevol/examples/loopdriver/driver"
	"github.com/nodevol/nodevol/internal/ondisk"
)

// The soak's scenario. soakDuration and soakPods set its size; the kill
// interval is drawn for each life of the agent, the churn interval for
// each pod added or deleted.
const (
	soakDuration = 30 * time.Second
	soakPods     = 50
	soakKillMin  = 200 * time.Millisecond
	soakKillMax  = 500 * time.Millisecond
	// soakChurnMax bounds the time between two changes of the wanted
	// pods (uniform in [0, soakChurnMax)): about 240 adds and deletes in
	// soakDuration, so each claim changes hands a few times.
	soakChurnMax = 250 * time.Millisecond
	// soakSeedEnv, if set, is the seed of the run to repeat (the test
	// logs each run's seed). The kills still land wherever the agent
	// happens to be, so a seed repeats the pattern, not the interleaving.
	soakSeedEnv = "NODEVOL_SOAK_SEED"
)

// TestE2ERepeatedKillSoak: the agent (agent-fake, as a separate process,
// on real ext4 volumes of the loop driver) is SIGKILLed 200-500 ms into
// each of its lives (counted from its SYNCED line) for soakDuration, while
// soakPods claims get and lose pods at random
// (each pod added or deleted through the running agent, and each restart
// of the agent given the pods that are wanted at that moment, as an API
// server would). Then the agent is started once more and left alone, and
// the node must converge to exactly what the wanted pods say:
//
//   - the invariant of e2e_invariant_test.go (mounts, loop devices,
//     directories, vol_data.json and nodevol's records of the wanted
//     volumes and nothing else; the data written before the soak reads
//     back, so no volume was reformatted);
//   - the loop driver's own state: each wanted volume staged at its
//     staging path and published at its pod's target only, every other
//     volume neither staged nor published;
//   - no NodeUnstageVolume while the volume was still published: the loop
//     driver refuses those ("still published", node.go) and logs the
//     refusal, which the test counts over the whole run and requires to
//     be zero.
//
// When the node does not converge, the test says which of the crash
// windows it knows the leftovers match (diagnose).
//
// Every volume is a filesystem volume: the harness (holdEnv, the
// invariant) knows the filesystem layout only, so the block windows are
// out of this soak's reach.
func TestE2ERepeatedKillSoak(t *testing.T) {
	requireFaultEnv(t)
	seed := soakSeed(t)
	t.Logf("seed %d (%s=%d repeats this run's pattern of kills and pods)", seed, soakSeedEnv, seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	e := newHoldEnv(t, ctx, "nv-soak-", soakPods)
	s := &soak{e: e, rng: rng, pods: make([]*holdVolume, soakPods), gen: make([]int, soakPods)}
	s.all = append(s.all, e.vols...)

	// A random half of the claims start with their pod; data written into
	// those must survive every unstage and stage that follows.
	for i := range e.vols {
		if rng.IntN(2) == 0 {
			s.pods[i] = &e.vols[i]
		}
	}
	a := e.startAgent(e.objectsWith(t, "objects.json", s.wanted()))
	a.expect(t, "READY", 2*time.Minute)
	for _, v := range s.wanted() {
		e.writeVolume(t, v)
	}
	t.Logf("setup: %d volumes, %d pods mounted and written to in %v", soakPods, len(s.wanted()), time.Since(start).Round(time.Millisecond))

	// The soak. Each life of the agent is timed from its SYNCED line (the
	// driver registered, the pods added, MarkPodsSynced called): starting
	// the test binary again takes longer than soakKillMax under -race on a
	// busy machine, and a kill before that point would find the agent with
	// nothing in flight. Sleeping here is the scenario (when the kills and
	// the changes land), not a wait for anything.
	soakStart := time.Now()
	end := soakStart.Add(soakDuration)
	fromSoak := fileSize(t, e.callLog)
	nextKill, nextChurn := soakStart.Add(s.killAfter()), soakStart.Add(s.churnAfter())
	for {
		wake := end
		for _, at := range []time.Time{nextKill, nextChurn} {
			if at.Before(wake) {
				wake = at
			}
		}
		time.Sleep(time.Until(wake))
		s.drain(t, a)
		now := time.Now()
		if now.Before(nextKill) && now.Before(end) {
			if !now.Before(nextChurn) {
				s.churn(t, a)
				nextChurn = now.Add(s.churnAfter())
			}
			continue
		}
		s.checkAlive(t, a)
		a.kill()
		s.kills++
		if !now.Before(end) {
			break
		}
		started := time.Now()
		a = e.startAgent(e.objectsWith(t, "objects.json", s.wanted()))
		nextChurn = s.waitSynced(t, a, started, nextChurn)
		nextKill = time.Now().Add(s.killAfter())
	}
	soakCalls := readCalls(t, e.callLog, fromSoak)
	slices.Sort(s.startups)
	t.Logf("soak: %d kills, %d pods added and %d deleted in %v; agent start to SYNCED min %v, median %v, max %v; driver calls during the soak %v",
		s.kills, s.adds, s.deletes, time.Since(soakStart).Round(time.Millisecond),
		s.startups[0].Round(time.Millisecond), s.startups[len(s.startups)/2].Round(time.Millisecond), s.startups[len(s.startups)-1].Round(time.Millisecond),
		callCounts(soakCalls))
	// A soak whose kills all landed before the agent did anything would
	// pass and prove nothing.
	if n := len(soakCalls) - countCalls(soakCalls, "NodeGetCapabilities", nil); n == 0 {
		t.Errorf("soak: the agents sent no Node RPC that changes a mount during the soak: every kill landed before the agent did any work")
	}

	// Left alone: the last agent gets the pods wanted now, and the node
	// must converge (waited for on the node's state, bounded).
	wanted := s.wanted()
	label := fmt.Sprintf("after %d kills, the agent left alone with %d of %d claims wanted", s.kills, len(wanted), soakPods)
	restart := time.Now()
	from := fileSize(t, e.callLog)
	a = e.startAgent(e.objectsWith(t, "objects.json", wanted))
	converge(t, e, label, wanted)
	calls := readCalls(t, e.callLog, from)
	t.Logf("%s: converged (or gave up) %v after the last start; its driver calls %v", label, time.Since(restart).Round(time.Millisecond), callCounts(calls))
	s.checkDriverState(t, label)
	s.checkRefusals(t, label)
	if t.Failed() {
		s.diagnose(t, label)
	}
	s.checkAlive(t, a)
	t.Logf("whole test %v (setup, %v soak, convergence)", time.Since(start).Round(time.Millisecond), soakDuration)
}

// soak is the test's side of the scenario: which pod each claim has now,
// as the API server would say.
type soak struct {
	e   *holdEnv
	rng *rand.Rand
	// pods is each claim's wanted pod (e.vols[i]'s claim), nil if none.
	pods []*holdVolume
	// gen counts each claim's pods: a new pod of a claim is a new pod
	// (name and UID), as when a workload's pod is replaced.
	gen []int
	// all are every pod of the run, wanted or not, for the diagnosis.
	all                   []holdVolume
	kills, adds, deletes  int
	startups              []time.Duration // each soak agent's start to SYNCED
	agentDied             bool
	unsent                int
	sendErrs, failedLines []string
}

// waitSynced waits for the agent's SYNCED line (bounded), keeping any
// FAILED line, and notes how long the agent took since started. An agent
// that exits first is reported by checkAlive. The pods go on changing
// meanwhile (at nextChurn, and returns the next time): the agent reads
// those commands once synced, so each life starts with work queued, as
// after pods changed while the agent was down.
func (s *soak) waitSynced(t *testing.T, a *agentProc, started, nextChurn time.Time) time.Time {
	t.Helper()
	deadline := time.After(time.Minute)
	for {
		churn := time.After(time.Until(nextChurn))
		select {
		case <-churn:
			s.churn(t, a)
			nextChurn = time.Now().Add(s.churnAfter())
		case line, ok := <-a.lines:
			if !ok {
				s.checkAlive(t, a)
				return nextChurn
			}
			if strings.HasPrefix(line, "FAILED") {
				t.Logf("agent: %s", line)
				s.failedLines = append(s.failedLines, line)
			}
			if line == "SYNCED" {
				s.startups = append(s.startups, time.Since(started))
				return nextChurn
			}
		case <-deadline:
			t.Fatalf("agent (life %d): no SYNCED within a minute of its start", s.kills+1)
		}
	}
}

// soakSeed is the seed from soakSeedEnv, or a new one.
func soakSeed(t *testing.T) int64 {
	if v := os.Getenv(soakSeedEnv); v != "" {
		seed, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", soakSeedEnv, v, err)
		}
		return seed
	}
	return time.Now().UnixNano()
}

func (s *soak) killAfter() time.Duration {
	return soakKillMin + time.Duration(s.rng.Int64N(int64(soakKillMax-soakKillMin)))
}

func (s *soak) churnAfter() time.Duration {
	return time.Duration(s.rng.Int64N(int64(soakChurnMax)))
}

// wanted returns the wanted pods' volumes, in claim order.
func (s *soak) wanted() []holdVolume {
	var out []holdVolume
	for _, p := range s.pods {
		if p != nil {
			out = append(out, *p)
		}
	}
	return out
}

// churn deletes the pod of a random claim that has one, or gives one a
// new pod, through the running agent. The agent may be killed before it
// has read the line: its next life starts from s.pods, as from the API.
func (s *soak) churn(t *testing.T, a *agentProc) {
	i := s.rng.IntN(soakPods)
	if p := s.pods[i]; p != nil {
		s.pods[i] = nil
		s.deletes++
		s.send(a, "delete "+podKey(*p))
		return
	}
	s.gen[i]++
	v := s.e.podOf(s.e.vols[i], fmt.Sprintf("soak-%d-%d", i, s.gen[i]))
	s.pods[i] = &v
	s.all = append(s.all, v)
	s.adds++
	data, err := json.Marshal(v.pod)
	if err != nil {
		t.Fatal(err)
	}
	s.send(a, "add "+string(data))
}

// send writes a command to the agent. Unlike agentProc.send it does not
// fail the test: the agent may be dying (checkAlive says whether it died
// on its own).
func (s *soak) send(a *agentProc, command string) {
	if _, err := io.WriteString(a.stdin, command+"\n"); err != nil {
		s.unsent++
		if len(s.sendErrs) < 5 {
			s.sendErrs = append(s.sendErrs, err.Error())
		}
	}
}

// drain reads what the agent said so far, keeping its FAILED lines: its
// stdout must not fill up while nobody waits for a line.
func (s *soak) drain(t *testing.T, a *agentProc) {
	for {
		select {
		case line, ok := <-a.lines:
			if !ok {
				return
			}
			if strings.HasPrefix(line, "FAILED") {
				t.Logf("agent: %s", line)
				s.failedLines = append(s.failedLines, line)
			}
		default:
			return
		}
	}
}

// checkAlive fails the test if the agent exited before the test killed
// it: a crash of its own is a bug, not part of the scenario.
func (s *soak) checkAlive(t *testing.T, a *agentProc) {
	t.Helper()
	select {
	case <-a.done:
		if !s.agentDied {
			t.Errorf("the agent exited on its own (not killed by the test), life %d: %v; see agent.log", s.kills+1, a.cmd.ProcessState)
		}
		s.agentDied = true
	default:
	}
}

// checkDriverState compares the loop driver's record of each volume with
// the wanted pods (driverStateProblem).
func (s *soak) checkDriverState(t *testing.T, label string) {
	t.Helper()
	for i, v := range s.e.vols {
		if p := s.e.driverStateProblem(v, s.pods[i]); p != "" {
			t.Errorf("%s: %s", label, p)
		}
	}
}

// driverStateProblem compares the loop driver's record of volume v with
// its wanted pod p (nil: none): a wanted volume staged at its staging path
// and published at its pod's target only; otherwise neither staged nor
// published. It returns "" when they agree.
func (e *holdEnv) driverStateProblem(v holdVolume, p *holdVolume) string {
	got, err := driver.ReadNodeState(filepath.Join(e.root, "loopdriver"), v.handle)
	if err != nil {
		return fmt.Sprintf("the driver's state of volume %s: %v", v.handle, err)
	}
	var want driver.NodeState
	what := "not wanted"
	if p != nil {
		want = driver.NodeState{StagingPath: p.staging, Targets: []string{p.target}}
		what = "wanted by pod " + p.pod.Name
	}
	if got.StagingPath != want.StagingPath || !slices.Equal(got.Targets, want.Targets) {
		return fmt.Sprintf("driver state of volume %s (%s): staged at %q, published at %v; want staged at %q, published at %v",
			v.handle, what, rel(e.root, got.StagingPath), rels(e.root, got.Targets), rel(e.root, want.StagingPath), rels(e.root, want.Targets))
	}
	return ""
}

// checkRefusals counts, over the whole run, the NodeUnstageVolume calls
// the loop driver refused because the volume was still published (its
// log: "CSI call failed" with "is still published at"): nodevol must
// never unstage a volume before every publish of it is gone.
func (s *soak) checkRefusals(t *testing.T, label string) {
	t.Helper()
	f, err := os.Open(filepath.Join(s.e.root, "loopdriver.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var refused []string
	failures := map[string]int{} // method code -> count, for the log
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, `"CSI call failed"`) {
			continue
		}
		failures[logValue(line, "method")+" "+logValue(line, "code")]++
		if strings.Contains(line, "is still published at") {
			refused = append(refused, logValue(line, "volumeID"))
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: driver calls that failed over the whole run: %v", label, failures)
	if len(refused) > 0 {
		t.Errorf("%s: %d NodeUnstageVolume refused by the driver because the volume was still published (volumes %v), want 0: nodevol unstaged a volume with a publish still there",
			label, len(refused), refused)
	}
}

// logValue returns the value of key=... in a klog text line, unquoted if
// quoted, or "".
func logValue(line, key string) string {
	_, after, ok := strings.Cut(line, " "+key+"=")
	if !ok {
		return ""
	}
	if strings.HasPrefix(after, `"`) {
		if v, err := strconv.QuotedPrefix(after); err == nil {
			u, _ := strconv.Unquote(v)
			return u
		}
	}
	v, _, _ := strings.Cut(after, " ")
	return v
}

// rels is rel for a list of paths.
func rels(root string, paths []string) []string {
	out := make([]string, len(paths))
	for i, p := range paths {
		out[i] = rel(root, p)
	}
	return out
}

// diagnose says, for what is left on the node, which of the crash windows
// known to leave it behind it matches, so that a failure names its cause:
//
//   - window 1, a block publish left behind when the agent is killed
//     between unmap and NodeUnpublishVolume: not reachable here, every
//     volume of this soak is a filesystem volume (see the test's doc);
//   - window 2, an empty pod volume directory that pins a staged device:
//     a pod that is not wanted still has its volume directory, and the
//     volume is still staged (mounted, a loop device, or staged in the
//     driver) although no wanted pod uses it;
//   - window 3, a record file that is a symlink, under nodevol's records;
//   - window 4, an empty staging directory leaking: the staging directory
//     of a volume that is not wanted is there, with nothing staged.
//
// Anything else left behind is reported as not matching a known window.
func (s *soak) diagnose(t *testing.T, label string) {
	t.Helper()
	root := s.e.root
	mounts := mountTableUnder(t, root)
	loops := loopDevicesUnder(t, root)
	stateDir := filepath.Join(root, "loopdriver")
	wantedPod := map[string]bool{} // pod UIDs
	for _, p := range s.pods {
		if p != nil {
			wantedPod[string(p.pod.UID)] = true
		}
	}
	var found []string
	known := map[string]bool{} // relative paths explained by a window
	for i, v := range s.e.vols {
		if s.pods[i] != nil {
			continue
		}
		st, _ := driver.ReadNodeState(stateDir, v.handle)
		staged := len(mounts[v.staging]) > 0 || len(loops[s.e.imagePath(v)]) > 0 || st.StagingPath != ""
		stagingDir := filepath.Dir(v.staging)
		var podDirs []string
		for _, p := range s.all {
			if p.pv != v.pv || wantedPod[string(p.pod.UID)] {
				continue
			}
			if dir := filepath.Dir(p.target); exists(dir) {
				podDirs = append(podDirs, dir)
			}
		}
		switch {
		case len(podDirs) > 0 && staged:
			for _, d := range podDirs {
				s.explain(known, d)
				found = append(found, fmt.Sprintf("window 2 (an empty pod volume directory pins a staged device): volume %s is not wanted, yet staged (staging path mounted %d times, loop devices %v, driver staged at %q) and pod volume directory %s is left: %s",
					v.handle, len(mounts[v.staging]), loops[s.e.imagePath(v)], rel(root, st.StagingPath), rel(root, d), describeDir(d, mounts)))
			}
			s.explain(known, stagingDir)
			known[rel(root, v.staging)] = true
		case len(podDirs) > 0:
			for _, d := range podDirs {
				found = append(found, fmt.Sprintf("not a known window: volume %s is not wanted and not staged, yet pod volume directory %s is left: %s", v.handle, rel(root, d), describeDir(d, mounts)))
			}
		case exists(stagingDir) && !staged:
			s.explain(known, stagingDir)
			found = append(found, fmt.Sprintf("window 4 (an empty staging directory leaking): volume %s is not wanted and not staged, yet its staging directory %s is left: %s",
				v.handle, rel(root, stagingDir), describeDir(stagingDir, mounts)))
		case staged:
			found = append(found, fmt.Sprintf("not a known window: volume %s is not wanted and no pod directory holds it, yet it is staged (staging path mounted %d times, loop devices %v, driver staged at %q)",
				v.handle, len(mounts[v.staging]), loops[s.e.imagePath(v)], rel(root, st.StagingPath)))
		}
	}
	_ = filepath.WalkDir(filepath.Join(root, ondisk.RecordsDir), func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.Type()&fs.ModeSymlink != 0 {
			target, _ := os.Readlink(path)
			known[rel(root, path)] = true
			found = append(found, fmt.Sprintf("window 3 (a record file that is a symlink): %s -> %s (%s)", rel(root, path), target, s.recordOf(path)))
		}
		return nil
	})
	for _, p := range invariantProblems(t, s.e, s.wanted()) {
		path, _, _ := strings.Cut(p, ":")
		if !known[path] && !strings.HasPrefix(p, "volume ") && !strings.HasPrefix(p, "loop devices") {
			found = append(found, "not matched to a window: "+p)
		}
	}
	if len(found) == 0 {
		t.Logf("%s: diagnosis: nothing left on the node matches a known crash window", label)
		return
	}
	t.Errorf("%s: diagnosis of what is left:\n  %s", label, strings.Join(found, "\n  "))
}

// explain marks dir and its record (relative paths, as the invariant's
// problems name them) as explained by a window.
func (s *soak) explain(known map[string]bool, dir string) {
	r := rel(s.e.root, dir)
	known[r] = true
	known[ondisk.RecordFile(r)] = true
}

// recordOf names the directory whose record path is, among the pods' and
// volumes' directories of the run, or says it is none of them.
func (s *soak) recordOf(path string) string {
	for _, v := range s.all {
		for _, dir := range []string{filepath.Dir(v.target), filepath.Dir(v.staging)} {
			if filepath.Join(s.e.root, ondisk.RecordFile(rel(s.e.root, dir))) == path {
				return "the record of " + rel(s.e.root, dir)
			}
		}
	}
	return "the record of no directory of this run"
}

// describeDir lists what is in dir (one level, with mounts), for messages.
func describeDir(dir string, mounts map[string][]mountEntry) string {
	entries, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "gone"
		}
		return err.Error()
	}
	if len(entries) == 0 {
		return "empty"
	}
	var parts []string
	for _, en := range entries {
		p := filepath.Join(dir, en.Name())
		part := en.Name() + " (" + en.Type().String()
		if n := len(mounts[p]); n > 0 {
			part += fmt.Sprintf(", mounted %d times", n)
		} else if en.IsDir() {
			if sub, _ := os.ReadDir(p); len(sub) == 0 {
				part += ", empty, not mounted"
			}
		}
		parts = append(parts, part+")")
	}
	return strings.Join(parts, ", ")
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}
