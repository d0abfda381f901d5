package main

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"syscall"
	"time"
)

// ctlArgs is a parsed systemctl command line.
type ctlArgs struct {
	verb   string
	names  []string // units, completed, or list-units' patterns
	states []string // list-units --state=
	quiet  bool     // is-active --quiet
}

// parseCtl parses systemctl's arguments, options anywhere.
func parseCtl(args []string) (ctlArgs, error) {
	var c ctlArgs
	var pos []string
	for _, a := range args {
		switch {
		case strings.HasPrefix(a, "--state="):
			c.states = append(c.states, strings.Split(strings.TrimPrefix(a, "--state="), ",")...)
		case a == "-q" || a == "--quiet":
			c.quiet = true
		case a == "--no-pager":
		case strings.HasPrefix(a, "-"):
			return ctlArgs{}, fmt.Errorf("option %s is not implemented by fakesystemd", a)
		default:
			pos = append(pos, a)
		}
	}
	if c.verb = "list-units"; len(pos) > 0 {
		c.verb, c.names = pos[0], pos[1:]
	}
	switch c.verb {
	case "list-units":
		return c, nil
	case "start", "stop", "restart", "kill", "reset-failed", "is-active":
	default:
		return ctlArgs{}, fmt.Errorf("'systemctl %s' is not implemented by fakesystemd (only list-units, start, stop, restart, kill, reset-failed and is-active are)", c.verb)
	}
	if len(c.names) == 0 {
		return ctlArgs{}, fmt.Errorf("systemctl %s needs a unit", c.verb)
	}
	for i, n := range c.names {
		var err error
		if c.names[i], err = unitName(n); err != nil {
			return ctlArgs{}, err
		}
	}
	return c, nil
}

func systemctl(args []string) error {
	c, err := parseCtl(args)
	if err != nil {
		return err
	}
	dir, err := unitsDir()
	if err != nil {
		return err
	}
	switch c.verb {
	case "list-units":
		us, err := loadAll(dir)
		fmt.Print(listUnits(us, c))
		return err
	case "is-active":
		return isActive(dir, c)
	}
	release, err := lock(dir)
	if err != nil {
		return err
	}
	defer release()
	var errs []error
	for _, name := range c.names {
		if err := change(dir, c.verb, name); err != nil {
			errs = append(errs, fmt.Errorf("failed to %s %s: %w", c.verb, name, err))
		}
	}
	return errors.Join(errs...)
}

// change runs a verb that changes the unit name, the lock held.
func change(dir, verb, name string) error {
	u, err := load(dir, name)
	if err != nil {
		return err
	}
	switch verb {
	case "reset-failed":
		// systemd would unload a failed transient unit, and the suite's
		// restart that follows would fail: a crashed kubelet stays
		// restartable instead.
		return nil
	case "kill": // killing nothing is no error, as with systemd's default --kill-whom=all
		if u.running() {
			_ = syscall.Kill(-u.MainPID, syscall.SIGTERM)
		}
		return nil
	case "stop":
		if u, err = stop(dir, u); err == nil && u.Result == "success" {
			err = unload(dir, name)
		}
		return err
	}
	if active, _ := u.state(); verb == "start" && active != "failed" {
		return nil
	}
	if u, err = stop(dir, u); err != nil { // restart, or start a failed unit
		return err
	}
	u.Supervisor, u.MainPID, u.Exited, u.Result, u.Status = proc{}, 0, false, "", ""
	if err := save(dir, u); err != nil {
		return err
	}
	return launch(dir, u)
}

// stopTimeout is systemd's default TimeoutStopSec: how long stop waits
// after SIGTERM, and again after SIGKILL.
var stopTimeout = 90 * time.Second

// stop ends u's processes as systemd stops a service: SIGTERM and SIGCONT
// to its process group, SIGKILL after stopTimeout; it waits until u's
// supervisor has recorded the end and exited, and returns u as recorded.
// Processes of the group other than the main one are not waited for.
func stop(dir string, u *unit) (*unit, error) {
	if !u.running() {
		return u, nil
	}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		_ = syscall.Kill(-u.MainPID, sig)
		_ = syscall.Kill(-u.MainPID, syscall.SIGCONT)
		for end := time.Now().Add(stopTimeout); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
			if u.Supervisor.alive() {
				continue
			}
			v, err := load(dir, u.Name)
			if errors.As(err, new(errNotLoaded)) { // it ended well, unloaded
				v, err = u, nil
				v.Exited, v.Result = true, "success"
			} else if err == nil && !v.Exited { // the supervisor was killed
				v.Exited, v.Result, v.Status = true, "resources", "supervisor killed"
				err = save(dir, v)
			}
			return v, err
		}
	}
	return u, fmt.Errorf("its supervisor (pid %d) still runs after SIGKILL to group %d", u.Supervisor.PID, u.MainPID)
}

// isActive prints each unit's ACTIVE state and fails with 3 when none is
// active.
func isActive(dir string, c ctlArgs) error {
	var code exitStatus = 3
	for _, name := range c.names {
		active := "inactive"
		if u, err := load(dir, name); err == nil {
			active, _ = u.state()
		} else if !errors.As(err, new(errNotLoaded)) {
			return err
		}
		if active == "active" {
			code = 0
		}
		if !c.quiet {
			fmt.Println(active)
		}
	}
	if code != 0 {
		return code
	}
	return nil
}

// listUnits is list-units' output: the units whose names match a pattern
// (any unit without patterns) and, with --state, whose LOAD, ACTIVE or
// SUB state is one of those.
func listUnits(us []*unit, c ctlArgs) string {
	rows := [][]string{{"  ", "UNIT", "LOAD", "ACTIVE", "SUB", "DESCRIPTION"}}
	for _, u := range us {
		match := len(c.names) == 0
		for _, p := range c.names {
			ok, _ := path.Match(p, u.Name)
			match = match || ok
		}
		active, sub := u.state()
		inState := slices.ContainsFunc(c.states, func(s string) bool { return s == "loaded" || s == active || s == sub })
		if match && (len(c.states) == 0 || inState) {
			rows = append(rows, []string{map[bool]string{false: "  ", true: "● "}[active == "failed"],
				u.Name, "loaded", active, sub, strings.Join(u.Argv, " ")})
		}
	}
	n := len(rows) - 1
	if n == 0 {
		rows = nil // no header alone
	}
	widths := make([]int, 5)
	for _, r := range rows {
		for i := range widths {
			widths[i] = max(widths[i], len(r[i]))
		}
	}
	var b strings.Builder
	for _, r := range rows {
		b.WriteString(r[0])
		for i := 1; i < 5; i++ {
			fmt.Fprintf(&b, "%-*s ", widths[i], r[i])
		}
		b.WriteString(r[5] + "\n")
	}
	if n > 0 {
		b.WriteString("\nLOAD   = Reflects whether the unit definition was properly loaded.\n" +
			"ACTIVE = The high-level unit activation state, i.e. generalization of SUB.\n" +
			"SUB    = The low-level unit activation state, values depend on unit type.\n")
	}
	fmt.Fprintf(&b, "%d loaded units listed. Pass --all to see loaded but inactive units, too.\n", n)
	return b.String()
}
