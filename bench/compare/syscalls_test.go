package main

import (
	"maps"
	"math"
	"slices"
	"strings"
	"testing"
)

// TestFileCall: lines of strace 6.1's -f -y output (this machine's; with -o
// a file each line starts with the pid, on stderr with "[pid N]"): a call
// on a path or a file counts, one on a socket, a pipe or an anonymous inode
// does not, an epoll_ctl by the descriptor it adds, an mmap only of a file;
// a call's resumption, a signal, an exit and a restart start no call.
func TestFileCall(t *testing.T) {
	cases := []struct {
		line string
		name string
		ok   bool
	}{
		{`16612 openat2(AT_FDCWD</dev/shm/sc>, ".", {flags=O_RDONLY|O_CLOEXEC|O_PATH, resolve=RESOLVE_NO_SYMLINKS|RESOLVE_BENEATH}, 24) = 13</dev/shm/sc>`, "openat2", true},
		{`12278 openat(AT_FDCWD</dev/shm/sc>, "/etc/ld.so.cache", O_RDONLY|O_CLOEXEC) = 3</etc/ld.so.cache>`, "openat", true},
		{`16612 unlinkat(AT_FDCWD</dev/shm/sc>, "/dev/shm/sc/t10/x", 0) = -1 EISDIR (Is a directory)`, "unlinkat", true},
		{`10995 pwrite64(31</dev/shm/r/84.json>, "{\"version\":1,\"bootID\":\"071cdef0-"..., 412, 0) = 412`, "pwrite64", true},
		{`16614 fchmod(14</dev/shm/p/.vol_data.json.tmp-6af53935e95a>, 0640) = 0`, "fchmod", true},
		{`12281 read(8</usr/share/zoneinfo/Etc/UTC>,  <unfinished ...>`, "read", true},
		{`10991 close(137</dev/shm/p/pvc-39e8291b>(deleted) <unfinished ...>`, "close", true},
		{`[pid 16613] newfstatat(3</etc/ld.so.cache>, "", {st_mode=S_IFREG|0644, st_size=34951, ...}, AT_EMPTY_PATH) = 0`, "newfstatat", true},
		{`mkdirat(AT_FDCWD</w>, "/w/t", 0700) = 0`, "mkdirat", true},
		{`16612 mmap(NULL, 34951, PROT_READ, MAP_PRIVATE, 3</etc/ld.so.cache>, 0) = 0x7f8996f26000`, "mmap", true},
		{`16612 epoll_ctl(6<anon_inode:[eventpoll]>, EPOLL_CTL_ADD, 5</dev/shm/sc/vm.test>, {events=EPOLLIN|EPOLLOUT|EPOLLRDHUP|EPOLLET, data={u32=3758096385, u64=4595021072335634433}}) = -1 EPERM (Operation not permitted)`, "epoll_ctl", true},

		{`16615 epoll_ctl(6<anon_inode:[eventpoll]>, EPOLL_CTL_ADD, 5<socket:[3616922]>, {events=EPOLLIN|EPOLLOUT|EPOLLRDHUP|EPOLLET, data={u32=3758096390, u64=4595021072335634438}}) = 0`, "epoll_ctl", false},
		{`16612 mmap(NULL, 8192, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0) = 0x7f8996f2f000`, "mmap", false},
		{`10991 write(11<socket:[3207632]>, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 24) = 24`, "write", false},
		{`16615 read(8<socket:[3616949]>, 0x19ce4d1e0000, 32768) = -1 EAGAIN (Resource temporarily unavailable)`, "read", false},
		{`12281 close(8<socket:[3366520]> <unfinished ...>`, "close", false},
		{`[pid 16644] write(1<pipe:[3616570]>, "goos: linux\n", 12) = 12`, "write", false},
		{`16612 eventfd2(0, EFD_CLOEXEC|EFD_NONBLOCK) = 7<anon_inode:[eventfd]>`, "eventfd2", false},
		{`16612 pipe2([8<pipe:[3616570]>, 9<pipe:[3616570]>], O_CLOEXEC) = 0`, "pipe2", false},
		{`16613 epoll_pwait(6<anon_inode:[eventpoll]>, [], 128, 0, NULL, 0) = 0`, "epoll_pwait", false},
		{`16613 ppoll([{fd=5<UNIX-STREAM:[3616922]>, events=POLLIN}], 1, NULL, NULL, 8) = 1`, "ppoll", false},

		{`12281 <... openat resumed>)             = 8</usr/share/zoneinfo/Etc/UTC>`, "", false},
		{`16612 --- SIGURG {si_signo=SIGURG, si_code=SI_TKILL, si_pid=16612, si_uid=0} ---`, "", false},
		{`16612 +++ exited with 0 +++`, "", false},
		{`16613 restart_syscall(<... resuming interrupted read ...>) = 0`, "", false},
		{``, "", false},
	}
	for _, c := range cases {
		name, ok := fileCall(c.line)
		if ok != c.ok || (name != c.name && c.name != "") || (c.name == "" && ok) {
			t.Errorf("fileCall(%s) = %q, %v, want %q, %v", c.line, name, ok, c.name, c.ok)
		}
	}
}

// TestParseStrace counts a trace's calls on files, an interrupted call
// once, and those from the test's first removal call on the directory the
// pods lived in (right under TMPDIR; that call interrupted too) apart; an
// earlier removal of another directory under TMPDIR (mount-utils' probe) is
// no split.
func TestParseStrace(t *testing.T) {
	const tr = `16612 execve("./vm.test", ["./vm.test", "-test.run", "^$"], 0x7ffc429d0f88 /* 41 vars */) = 0
16612 unlinkat(AT_FDCWD</w/volumemanager>, "/tmp/b/kubelet-detect-safe-umount1888093698", 0) = -1 EISDIR (Is a directory)
16612 unlinkat(AT_FDCWD</w/volumemanager>, "/tmp/b/kubelet-detect-safe-umount1888093698", AT_REMOVEDIR) = 0
16612 mkdirat(AT_FDCWD</w/volumemanager>, "/tmp/b/BenchmarkMountPodspods=1001638573850/001", 0777) = 0
16612 openat(AT_FDCWD</w>, "/w/a", O_RDONLY|O_CLOEXEC <unfinished ...>
16613 read(8<socket:[1]>, "x", 32768) = 1
16612 <... openat resumed>) = 3</w/a>
16612 read(3</w/a>, "{}", 512) = 2
16614 mkdirat(5</tmp/b/BenchmarkMountPodspods=1001638573850/001/pods/663851d0>, "volumes", 0750) = 0
16612 close(3</w/a>) = 0
16613 close(8<socket:[1]>) = 0
16612 unlinkat(AT_FDCWD</w/volumemanager>, "/tmp/b/BenchmarkMountPodspods=1001638573850", 0 <unfinished ...>
16612 <... unlinkat resumed>) = -1 EISDIR (Is a directory)
16612 unlinkat(AT_FDCWD</w/volumemanager>, "/tmp/b/BenchmarkMountPodspods=1001638573850", AT_REMOVEDIR) = -1 ENOTEMPTY (Directory not empty)
16612 openat(AT_FDCWD</w/volumemanager>, "/tmp/b/BenchmarkMountPodspods=1001638573850", O_RDONLY|O_CLOEXEC|O_DIRECTORY) = 3</tmp/b/BenchmarkMountPodspods=1001638573850>
16612 getdents64(3</tmp/b/BenchmarkMountPodspods=1001638573850>, 0xc000 /* 3 entries */, 8192) = 80
16613 write(8<socket:[1]>, "x", 1) = 1
16612 +++ exited with 0 +++
`
	got, err := parseStrace(strings.NewReader(tr), "/tmp/b/")
	if err != nil {
		t.Fatal(err)
	}
	want := trace{
		run:     syscallCounts{"execve": 1, "unlinkat": 2, "mkdirat": 2, "openat": 1, "read": 1, "close": 1},
		removal: syscallCounts{"unlinkat": 2, "openat": 1, "getdents64": 1},
	}
	if !maps.Equal(got.run, want.run) || !maps.Equal(got.removal, want.removal) {
		t.Errorf("parseStrace = %v, want %v", got, want)
	}
	all := syscallCounts{"execve": 1, "unlinkat": 4, "mkdirat": 2, "openat": 2, "read": 1, "close": 1, "getdents64": 1}
	if !maps.Equal(got.all(), all) {
		t.Errorf("all = %v, want %v", got.all(), all)
	}
}

// TestTracePerPod: the removal's calls count in the total and per call,
// and apart under removalUnit.
func TestTracePerPod(t *testing.T) {
	low := trace{run: syscallCounts{"close": 300, "openat": 200}, removal: syscallCounts{"unlinkat": 100, "close": 50}}
	high := trace{run: syscallCounts{"close": 900, "openat": 600}, removal: syscallCounts{"unlinkat": 300, "close": 150}}
	got, err := tracePerPod(low, high, 100, 300)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{"sys-close/pod": 3.5, "sys-openat/pod": 2, "sys-unlinkat/pod": 1, syscallUnit: 6.5, removalUnit: 1.5}
	if !maps.Equal(got, want) {
		t.Errorf("tracePerPod = %v, want %v", got, want)
	}
}

// TestPerPod: each call's count per pod is the difference of the two runs
// over the difference of their pod counts, 0 for a call made as often in
// both, negative where the high run made fewer (noise), and the total is
// their sum.
func TestPerPod(t *testing.T) {
	cases := []struct {
		name      string
		low, high syscallCounts
		lo, hi    int
		want      map[string]float64
		err       bool
	}{
		{"W1", syscallCounts{"close": 3500, "openat": 2100, "execve": 2}, syscallCounts{"close": 9900, "openat": 6000, "execve": 2}, 100, 300,
			map[string]float64{"sys-close/pod": 32, "sys-openat/pod": 19.5, "sys-execve/pod": 0, syscallUnit: 51.5}, false},
		{"one run only", syscallCounts{"mmap": 10}, syscallCounts{"statx": 8}, 1, 5,
			map[string]float64{"sys-mmap/pod": -2.5, "sys-statx/pod": 2, syscallUnit: -0.5}, false},
		{"empty", syscallCounts{}, syscallCounts{}, 100, 300, map[string]float64{syscallUnit: 0}, false},
		{"same pods", syscallCounts{"close": 1}, syscallCounts{"close": 2}, 100, 100, nil, true},
		{"reversed", syscallCounts{"close": 1}, syscallCounts{"close": 2}, 300, 100, nil, true},
	}
	for _, c := range cases {
		got, err := perPod(c.low, c.high, c.lo, c.hi)
		if (err != nil) != c.err {
			t.Errorf("%s: perPod error %v, want error %v", c.name, err, c.err)
			continue
		}
		if !maps.EqualFunc(got, c.want, func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }) {
			t.Errorf("%s: perPod = %v, want %v", c.name, got, c.want)
		}
	}
}

// TestParsePodPair: two pod counts, the lower first.
func TestParsePodPair(t *testing.T) {
	cases := []struct {
		in     string
		lo, hi int
		err    bool
	}{
		{"100,300", 100, 300, false},
		{" 10, 20 ", 10, 20, false},
		{"300,100", 0, 0, true},
		{"100,100", 0, 0, true},
		{"0,100", 0, 0, true},
		{"100", 0, 0, true},
		{"100,200,300", 0, 0, true},
		{"a,b", 0, 0, true},
	}
	for _, c := range cases {
		lo, hi, err := parsePodPair(c.in)
		if (err != nil) != c.err || lo != c.lo || hi != c.hi {
			t.Errorf("parsePodPair(%q) = %d, %d, %v; want %d, %d, error %v", c.in, lo, hi, err, c.lo, c.hi, c.err)
		}
	}
}

// TestSyscallRows: the total first, then the calls by the most either side
// made, calls below minCallsPerPod on both sides left out; none without a
// total.
func TestSyscallRows(t *testing.T) {
	nv := map[string]float64{syscallUnit: 125, "sys-close/pod": 32, "sys-openat2/pod": 19, "sys-mmap/pod": -0.03, "sys-execve/pod": 0}
	kl := map[string]float64{syscallUnit: 83, "sys-close/pod": 7, "sys-fcntl/pod": 16, "sys-openat2/pod": 0, "sys-fstat/pod": -0.5}
	var got []string
	for _, r := range syscallRows(nv, kl) {
		got = append(got, r.unit+":"+r.label)
	}
	want := []string{
		syscallUnit + ":file-system system calls per pod (mount + unmount)",
		removalUnit + ":  of which the test's removal of what the run left",
		"sys-close/pod:  of which close",
		"sys-openat2/pod:  of which openat2",
		"sys-fcntl/pod:  of which fcntl",
		"sys-fstat/pod:  of which fstat",
	}
	if !slices.Equal(got, want) {
		t.Errorf("syscallRows =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if r := syscallRows(map[string]float64{"mount-s": 1}, nil); r != nil {
		t.Errorf("syscallRows without counts = %v, want none", r)
	}
}

// TestTableSyscalls: W1's and W6's calls per pod sit beside the floor's
// counted between the same pod counts, a side that made none of a call
// shows 0, the note gives each side less the test's removal and less the
// driver's (the floor less its removal), and W6's other rows get no floor.
func TestTableSyscalls(t *testing.T) {
	w1, w6, floor := syscallName("MountPods", 100, 300), syscallName("RealPods", 100, 300), syscallName("DriverOnly", 100, 300)
	nv := []results{{
		w1:                                {syscallUnit: 125, removalUnit: 20, "sys-close/pod": 32, "sys-openat2/pod": 19},
		w6:                                {syscallUnit: 500, removalUnit: 60, "sys-close/pod": 127},
		floor:                             {syscallUnit: 13, removalUnit: 6, "sys-close/pod": 1},
		"BenchmarkRealPods/pods=100":      {"mount-s": 2},
		"BenchmarkDriverOnly/volumes=100": {"mount-s": 1},
	}}
	kl := []results{{
		w1: {syscallUnit: 83, removalUnit: 19, "sys-close/pod": 7, "sys-openat2/pod": 0},
		w6: {syscallUnit: 460, "sys-close/pod": 40},
	}}
	var out strings.Builder
	table(&out, nv, kl)
	var got []string
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n")[1:] {
		got = append(got, strings.Join(strings.Fields(l), " "))
	}
	want := []string{
		"MountPods/pods=100..300 file-system system calls per pod (mount + unmount) 125 83 1.506 13 9.615",
		"MountPods/pods=100..300 of which the test's removal of what the run left 20 19 1.053 6 3.333",
		"MountPods/pods=100..300 of which close 32 7 4.571 1 32",
		"MountPods/pods=100..300 of which openat2 19 0 - - -",
		"RealPods/pods=100 mount wall s 2 - - - -",
		"RealPods/pods=100..300 file-system system calls per pod (mount + unmount) 500 460 1.087 13 38.46",
		"RealPods/pods=100..300 of which the test's removal of what the run left 60 - - 6 10",
		"RealPods/pods=100..300 of which close 127 40 3.175 1 127",
		"MountPods/pods=100..300: file-system system calls per pod less the test's removal and the driver's 7: nodevol 98 kubelet 57",
		"RealPods/pods=100..300: file-system system calls per pod less the test's removal and the driver's 7: nodevol 433 kubelet 453",
	}
	if !slices.Equal(got, want) {
		t.Errorf("table =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestZeroMissing: a call one side made and another never did is 0 on the
// other, and a side that counted nothing stays so.
func TestZeroMissing(t *testing.T) {
	nv := map[string]float64{syscallUnit: 125, "sys-openat2/pod": 19}
	kl := map[string]float64{syscallUnit: 83, "sys-fcntl/pod": 16}
	zeroMissing(nv, kl, nil)
	if want := map[string]float64{syscallUnit: 125, "sys-openat2/pod": 19, "sys-fcntl/pod": 0}; !maps.Equal(nv, want) {
		t.Errorf("nodevol's = %v, want %v", nv, want)
	}
	if want := map[string]float64{syscallUnit: 83, "sys-fcntl/pod": 16, "sys-openat2/pod": 0}; !maps.Equal(kl, want) {
		t.Errorf("kubelet's = %v, want %v", kl, want)
	}
}
