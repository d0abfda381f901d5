package main

import (
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestParseRun(t *testing.T) {
	for _, tc := range []struct {
		name string
		args string // split on spaces
		want runArgs
		err  string
	}{{
		name: "the suite's kubelet, escaped by adjustArgsForSystemd",
		args: "-p Delegate=true -p StandardError=append:/r/%%d/kubelet.log --unit=kubelet-20250102T030405.service --slice=runtime.slice --remain-after-exit /bin/kubelet --v 4 --x=a%%b$$c",
		want: runArgs{unit: "kubelet-20250102T030405.service", stderr: output{"/r/%d/kubelet.log", true}, remain: true,
			argv: []string{"/bin/kubelet", "--v", "4", "--x=a%%b$$c"}},
	}, {
		name: "version",
		args: "--version",
		want: runArgs{version: true},
	}, {
		name: "journal",
		args: "--unit=kubelet-x --property=StandardError=journal -- -cmd",
		err:  "property StandardError=journal is not implemented",
	}, {
		name: "the unit name is completed; -- ends the options",
		args: "--unit=kubelet-x --property=StandardOutput=file:/o -- -cmd",
		want: runArgs{unit: "kubelet-x.service", stdout: output{"/o", false}, argv: []string{"-cmd"}},
	}, {
		name: "mount-utils' systemd probe",
		args: "--description=Kubernetes systemd probe --scope true",
		err:  "option --description is not implemented by fakesystemd",
	}, {
		name: "scope",
		args: "--unit=x --scope true",
		err:  "option --scope is not implemented by fakesystemd",
	}, {
		name: "no unit",
		args: "sleep 1",
		err:  "needs --unit=NAME",
	}, {
		name: "no command",
		args: "--unit=x",
		err:  "and a command",
	}, {
		name: "other property",
		args: "-p MemoryMax=1G --unit=x sleep",
		err:  "property MemoryMax=1G is not implemented",
	}, {
		name: "relative log",
		args: "-p StandardError=append:kubelet.log --unit=x sleep",
		err:  "is not implemented",
	}, {
		name: "bad unit name",
		args: "--unit=../x sleep",
		err:  "invalid unit name",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseRun(strings.Fields(tc.args))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("parseRun(%s) = %+v, %v; want error %q", tc.args, got, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(runArgs{})); diff != "" {
				t.Errorf("parseRun(%s) (-want +got):\n%s", tc.args, diff)
			}
		})
	}
}

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{
		"":                   "",
		"plain":              "plain",
		"%%":                 "%",
		"$$":                 "$",
		"%%%%":               "%%",
		"$$$$$":              "$$$",
		"a%%b$$c":            "a%b$c",
		"--x=$$HOME/%%n":     "--x=$HOME/%n",
		"%n $HOME":           "%n $HOME", // systemd would expand these; the suite never leaves them
		"--node-labels=a=b,": "--node-labels=a=b,",
	} {
		if got := unescape(in); got != want {
			t.Errorf("unescape(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestParseCtl(t *testing.T) {
	for _, tc := range []struct {
		args string
		want ctlArgs
		err  string
	}{
		{args: "list-units *kubelet* --state=running", want: ctlArgs{verb: "list-units", names: []string{"*kubelet*"}, states: []string{"running"}}},
		{args: "list-units *kubelet*", want: ctlArgs{verb: "list-units", names: []string{"*kubelet*"}}},
		{args: "", want: ctlArgs{verb: "list-units"}},
		{args: "--no-pager list-units --state=failed,running", want: ctlArgs{verb: "list-units", states: []string{"failed", "running"}}},
		{args: "reset-failed kubelet-20250102T030405", want: ctlArgs{verb: "reset-failed", names: []string{"kubelet-20250102T030405.service"}}},
		{args: "kill kubelet-x.service", want: ctlArgs{verb: "kill", names: []string{"kubelet-x.service"}}},
		{args: "restart a b.service", want: ctlArgs{verb: "restart", names: []string{"a.service", "b.service"}}},
		{args: "is-active --quiet a", want: ctlArgs{verb: "is-active", names: []string{"a.service"}, quiet: true}},
		{args: "stop", err: "systemctl stop needs a unit"},
		{args: "mask --now locksmithd", err: "option --now is not implemented by fakesystemd"},
		{args: "mask locksmithd", err: "'systemctl mask' is not implemented by fakesystemd"},
		{args: "status kubelet-x", err: "'systemctl status' is not implemented by fakesystemd"},
		{args: "kill -s KILL kubelet-x", err: "option -s is not implemented"},
		{args: "kill --signal=KILL kubelet-x", err: "option --signal=KILL is not implemented"},
		{args: "list-units --all", err: "option --all is not implemented"},
		{args: "stop ../x", err: "invalid unit name"},
	} {
		got, err := parseCtl(strings.Fields(tc.args))
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("parseCtl(%s) = %+v, %v; want error %q", tc.args, got, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("parseCtl(%s): %v", tc.args, err)
		} else if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(ctlArgs{}), cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("parseCtl(%s) (-want +got):\n%s", tc.args, diff)
		}
	}
}

func TestListUnits(t *testing.T) {
	running := &unit{Name: "kubelet-20250102T030405.service", Argv: []string{"/bin/kubelet", "--v", "4"}, MainPID: 1, Supervisor: self()}
	exited := &unit{Name: "kubelet-20250101T000000.service", Argv: []string{"/bin/kubelet"}, MainPID: 1, Exited: true, Result: "success"}
	failed := &unit{Name: "other.service", Argv: []string{"/bin/false"}, MainPID: 1, Exited: true, Result: "exit-code"}
	us := []*unit{exited, running, failed} // as loadAll sorts them
	legend := `
LOAD   = Reflects whether the unit definition was properly loaded.
ACTIVE = The high-level unit activation state, i.e. generalization of SUB.
SUB    = The low-level unit activation state, values depend on unit type.
`
	for _, tc := range []struct {
		args, want string
	}{{
		args: "list-units *kubelet* --state=running",
		want: `  UNIT                            LOAD   ACTIVE SUB     DESCRIPTION
  kubelet-20250102T030405.service loaded active running /bin/kubelet --v 4
` + legend + "1 loaded units listed. Pass --all to see loaded but inactive units, too.\n",
	}, {
		args: "list-units",
		want: `  UNIT                            LOAD   ACTIVE SUB     DESCRIPTION
  kubelet-20250101T000000.service loaded active exited  /bin/kubelet
  kubelet-20250102T030405.service loaded active running /bin/kubelet --v 4
● other.service                   loaded failed failed  /bin/false
` + legend + "3 loaded units listed. Pass --all to see loaded but inactive units, too.\n",
	}, {
		args: "list-units *kubelet* --state=failed",
		want: "0 loaded units listed. Pass --all to see loaded but inactive units, too.\n",
	}} {
		c, err := parseCtl(strings.Fields(tc.args))
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(tc.want, listUnits(us, c)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.args, diff)
		}
	}

	// What findKubeletServiceName(true) finds: the running unit, which
	// systemctl completes again.
	c, _ := parseCtl([]string{"list-units", "*kubelet*", "--state=running"})
	if m := regexp.MustCompile(`(kubelet-\w+)`).FindStringSubmatch(listUnits(us, c)); len(m) == 0 || m[0] != "kubelet-20250102T030405" {
		t.Errorf("the suite's regexp finds %q, want kubelet-20250102T030405", m)
	}
}
