package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
)

// unit is a loaded unit, as its file in the units directory holds it.
// While a unit's supervisor lives, it alone writes the file; otherwise
// only a command holding the lock does (stop waits for the supervisor to
// exit). Files are replaced whole, so readers take no lock.
type unit struct {
	Name            string
	Argv            []string // unescaped; the executable an absolute path
	Env             []string // systemd-run's caller's
	Stdout, Stderr  output
	RemainAfterExit bool

	// Set by the supervisor of the unit's latest start.
	Supervisor proc
	MainPID    int // also the unit's process group
	Exited     bool
	Result     string // systemd's: success, exit-code, signal, resources
	Status     string // how the main process ended, for people
}

// output is a StandardOutput= or StandardError= file: Append or not
// (append: or file:).
type output struct {
	Path   string
	Append bool
}

// proc names a process across pid reuse.
type proc struct {
	PID   int
	Start uint64 // /proc/PID/stat's starttime
}

// state is the unit's ACTIVE and SUB states, as list-units shows them.
func (u *unit) state() (active, sub string) {
	switch {
	case u.Exited && u.Result != "success":
		return "failed", "failed"
	case u.Exited:
		return "active", "exited"
	case u.Supervisor.PID == 0:
		return "activating", "start"
	case !u.Supervisor.alive(): // killed
		return "failed", "failed"
	}
	return "active", "running"
}

// running reports whether the unit may have processes to signal.
func (u *unit) running() bool { return u.MainPID != 0 && !u.Exited }

var (
	validName = regexp.MustCompile(`^[A-Za-z0-9:_\\@-][A-Za-z0-9:_.\\@-]*$`)
	typed     = regexp.MustCompile(`\.(service|socket|target|device|mount|automount|swap|timer|path|slice|scope)$`)
)

// unitName is name completed with ".service" when it has no unit type,
// as systemctl and systemd-run complete it.
func unitName(name string) (string, error) {
	if !validName.MatchString(name) {
		return "", fmt.Errorf("invalid unit name %q", name)
	}
	if !typed.MatchString(name) {
		name += ".service"
	}
	return name, nil
}

// unitsDir is the directory of units, from $NODEVOL_UNITS_DIR.
func unitsDir() (string, error) {
	dir := os.Getenv(dirEnv)
	if dir == "" {
		return "", fmt.Errorf("%s is not set: fakesystemd keeps its units in the directory it names (the node conformance runner sets it)", dirEnv)
	}
	return dir, os.MkdirAll(dir, 0o755)
}

// lock takes the units directory's lock, which serializes the commands
// that change units.
func lock(dir string) (release func(), err error) {
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err == nil {
		if err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
			f.Close()
		}
	}
	return func() { f.Close() }, err
}

// errNotLoaded is the error of a unit that has no file.
type errNotLoaded string

func (e errNotLoaded) Error() string { return fmt.Sprintf("Unit %s not loaded.", string(e)) }

func unitPath(dir, name string) string { return filepath.Join(dir, name+".json") }

func load(dir, name string) (*unit, error) {
	data, err := os.ReadFile(unitPath(dir, name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errNotLoaded(name)
	}
	u := &unit{}
	if err == nil {
		err = json.Unmarshal(data, u)
	}
	return u, err
}

// loadAll is every loaded unit, by name.
func loadAll(dir string) ([]*unit, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.json")) // sorted
	var us []*unit
	for _, p := range paths {
		u, err := load(dir, strings.TrimSuffix(filepath.Base(p), ".json"))
		if errors.As(err, new(errNotLoaded)) {
			continue // unloaded since
		} else if err != nil {
			return nil, err
		}
		us = append(us, u)
	}
	return us, err
}

func save(dir string, u *unit) error {
	data, err := json.MarshalIndent(u, "", "\t")
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, "."+u.Name+".*.tmp")
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err = errors.Join(err, f.Close()); err == nil {
		err = os.Rename(f.Name(), unitPath(dir, u.Name))
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

// unload removes a unit's file: systemd unloads a transient unit once it
// is inactive and has not failed.
func unload(dir, name string) error {
	if err := os.Remove(unitPath(dir, name)); !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// procStart is a process's start time, and whether it runs: it exists
// and is no zombie (an orphan's, which this machine's PID 1 reaps late).
func procStart(pid int) (start uint64, runs bool) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	// pid (comm) state ppid ... starttime is field 22.
	i := strings.LastIndexByte(string(data), ')')
	if err != nil || i < 0 {
		return 0, false
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 20 || f[0] == "Z" || f[0] == "X" {
		return 0, false
	}
	start, err = strconv.ParseUint(f[19], 10, 64)
	return start, err == nil
}

func self() proc {
	start, _ := procStart(os.Getpid())
	return proc{os.Getpid(), start}
}

// alive reports whether p runs, and is the process that ran then.
func (p proc) alive() bool {
	start, runs := procStart(p.PID)
	return p.PID > 0 && runs && start == p.Start
}
