package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// version is what systemd-run --version prints: the suite appends to the
// kubelet's log from 240 on and runs its graceful shutdown specs from 245
// on. 252 is this machine's systemd.
const version = "systemd 252 (252-nodevol-fakesystemd)"

// runArgs is a parsed systemd-run command line.
type runArgs struct {
	version        bool
	unit           string
	stdout, stderr output
	remain         bool
	argv           []string // as given, escaped
}

// parseRun parses systemd-run's arguments: options, then the command.
func parseRun(args []string) (r runArgs, err error) {
	for len(args) > 0 && strings.HasPrefix(args[0], "-") && err == nil {
		opt, val, _ := strings.Cut(args[0], "=")
		if args = args[1:]; opt == "-p" && len(args) > 0 {
			opt, val, args = "--property", args[0], args[1:]
		}
		switch opt {
		case "--":
			return r, r.command(args)
		case "--version":
			return runArgs{version: true}, nil
		case "--property":
			err = r.property(val)
		case "--unit":
			r.unit, err = unitName(val)
		case "--slice": // no cgroups
		case "--remain-after-exit":
			r.remain = true
		default:
			err = fmt.Errorf("option %s is not implemented by fakesystemd", opt)
		}
	}
	if err != nil {
		return runArgs{}, err
	}
	return r, r.command(args)
}

func (r *runArgs) command(argv []string) error {
	r.argv = argv
	if r.unit == "" || len(argv) == 0 {
		return errors.New("fakesystemd needs --unit=NAME and a command")
	}
	return nil
}

func (r *runArgs) property(p string) error {
	name, val, _ := strings.Cut(p, "=")
	out := map[string]*output{"StandardOutput": &r.stdout, "StandardError": &r.stderr}[name]
	mode, path, _ := strings.Cut(val, ":")
	switch {
	case name == "Delegate": // no cgroups
		return nil
	case out == nil || (mode != "file" && mode != "append") || !filepath.IsAbs(path):
		return fmt.Errorf("property %s is not implemented by fakesystemd (StandardOutput and StandardError take file: or append: an absolute path)", p)
	}
	// A path is subject to specifier expansion, not to variables'.
	*out = output{strings.ReplaceAll(path, "%%", "%"), mode == "append"}
	return nil
}

// unescape undoes the escaping that systemd's expansion of a command
// line needs: %% is %, $$ is $. Other specifiers and variables are left
// as they are; systemd would expand them.
var unescape = strings.NewReplacer("%%", "%", "$$", "$").Replace

// systemdRun records a new unit and starts it.
func systemdRun(args []string) error {
	r, err := parseRun(args)
	if r.version {
		fmt.Println(version)
	}
	if err != nil || r.version {
		return err
	}
	u := &unit{Name: r.unit, Env: os.Environ(), Stdout: r.stdout, Stderr: r.stderr, RemainAfterExit: r.remain}
	for _, a := range r.argv {
		u.Argv = append(u.Argv, unescape(a))
	}
	// systemd-run looks the command up on its caller's PATH.
	exe, err := exec.LookPath(u.Argv[0])
	if err == nil {
		u.Argv[0], err = filepath.Abs(exe)
	}
	dir, derr := unitsDir()
	if err = errors.Join(err, derr); err != nil {
		return err
	}
	release, err := lock(dir)
	if err != nil {
		return err
	}
	defer release()
	if _, err := load(dir, u.Name); !errors.As(err, new(errNotLoaded)) {
		return errors.Join(fmt.Errorf("unit %s was already loaded", u.Name), err)
	}
	if err := save(dir, u); err != nil {
		return err
	}
	// Said before the start: the caller's output may be the unit's log.
	fmt.Fprintf(os.Stderr, "Running as unit: %s\n", u.Name)
	return launch(dir, u)
}

// superviseName is the name launch runs this command by, with the units
// directory and a unit's name, as the unit's supervisor.
const superviseName = "fakesystemd-supervise"

// launch starts the saved, not running unit u: it starts its supervisor
// in a session of its own and returns once that has started u's command.
// The caller holds the lock.
func launch(dir string, u *unit) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	cmd := &exec.Cmd{Path: exe, Args: []string{superviseName, dir, u.Name}, Dir: "/",
		ExtraFiles: []*os.File{w}, SysProcAttr: &syscall.SysProcAttr{Setsid: true}}
	err = cmd.Start()
	w.Close()
	if err != nil {
		return err
	}
	msg, _ := io.ReadAll(r)
	if string(msg) == "started\n" {
		return nil // it goes on without us
	}
	if err := cmd.Wait(); len(msg) == 0 { // it recorded nothing
		u.Exited, u.Result, u.Status = true, "resources", fmt.Sprint(err)
		return errors.Join(fmt.Errorf("the supervisor failed: %v", err), save(dir, u))
	}
	return errors.New(strings.TrimSpace(string(msg)))
}

// supervise starts a unit's command in a process group of its own, says
// so on file descriptor 3, and records how the command ended.
func supervise(args []string) error {
	syscall.CloseOnExec(3) // the unit must not hold launch's pipe
	ready := os.NewFile(3, "ready")
	if len(args) != 2 {
		return fmt.Errorf("usage: %s DIR UNIT", superviseName)
	}
	dir, name := args[0], args[1]
	u, err := load(dir, name)
	if err != nil {
		fmt.Fprintf(ready, "%s: %v\n", name, err)
		return err
	}
	cmd := &exec.Cmd{Path: u.Argv[0], Args: u.Argv, Env: u.Env, Dir: "/", SysProcAttr: &syscall.SysProcAttr{Setpgid: true}}
	if err = u.openOutput(cmd, dir); err == nil {
		err = cmd.Start()
		for _, f := range []io.Writer{cmd.Stdout, cmd.Stderr} {
			f.(*os.File).Close()
		}
	}
	if err == nil {
		u.MainPID, u.Supervisor = cmd.Process.Pid, self()
		if err = save(dir, u); err != nil {
			_ = syscall.Kill(-u.MainPID, syscall.SIGKILL)
		}
	} else {
		u.Exited, u.Result, u.Status = true, "exit-code", "203/EXEC"
		err = errors.Join(err, save(dir, u))
	}
	if err != nil {
		fmt.Fprintf(ready, "%s: %v\n", name, err)
		return err
	}
	fmt.Fprintln(ready, "started")
	ready.Close()

	_ = cmd.Wait()
	u.Exited = true
	u.Result, u.Status = result(cmd.ProcessState.Sys().(syscall.WaitStatus))
	if u.Result == "success" && !u.RemainAfterExit {
		return unload(dir, name)
	}
	return save(dir, u)
}

// openOutput opens the unit's output files for cmd. With no journal here,
// an output not named goes where the other goes, and with neither named
// both go to NAME.log in the units directory.
func (u *unit) openOutput(cmd *exec.Cmd, dir string) error {
	outs := slices.DeleteFunc([]output{u.Stdout, u.Stderr}, func(o output) bool { return o.Path == "" })
	if len(outs) == 0 {
		outs = []output{{filepath.Join(dir, u.Name+".log"), true}}
	}
	var files []*os.File
	for _, o := range outs {
		flags := os.O_WRONLY | os.O_CREATE
		if o.Append {
			flags |= os.O_APPEND
		}
		f, err := os.OpenFile(o.Path, flags, 0o644)
		if err != nil {
			for _, f := range files {
				f.Close()
			}
			return err
		}
		files = append(files, f)
	}
	cmd.Stdout, cmd.Stderr = files[0], files[len(files)-1]
	return nil
}

// result is systemd's Result of a service whose main process ended so:
// a daemon killed by SIGHUP, SIGINT, SIGTERM or SIGPIPE ended well.
func result(ws syscall.WaitStatus) (result, status string) {
	switch {
	case ws.Exited() && ws.ExitStatus() == 0:
		return "success", "0/SUCCESS"
	case ws.Exited():
		return "exit-code", fmt.Sprint(ws.ExitStatus())
	}
	switch status = strings.TrimPrefix(unix.SignalName(ws.Signal()), "SIG"); ws.Signal() {
	case syscall.SIGHUP, syscall.SIGINT, syscall.SIGTERM, syscall.SIGPIPE:
		return "success", status
	}
	return "signal", status
}
