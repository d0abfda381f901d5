package flexvolume

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"k8s.io/klog/v2"
)

// The driver's commands, the kubelet's.
const (
	cmdInit          = "init"
	cmdGetVolumeName = "getvolumename"
	cmdAttach        = "attach"
	cmdWaitForAttach = "waitforattach"
	cmdDetach        = "detach"
	cmdMountDevice   = "mountdevice"
	cmdUnmountDevice = "unmountdevice"
	cmdMount         = "mount"
	cmdUnmount       = "unmount"
)

// The statuses of a driver's reply.
const (
	// statusSuccess is a reply of a call that did what it was asked.
	statusSuccess = "Success"
	// statusNotSupported is a reply of a driver that does not implement
	// the command: the kubelet's default behaviour takes its place.
	statusNotSupported = "Not supported"
)

// errNotSupported is the error of a call whose command the driver does not
// support (its reply's status is "Not supported", now or at an earlier
// call since its init). Its text is the kubelet's.
//
//lint:ignore ST1005 the kubelet's text: the driver's status
var errNotSupported = errors.New(statusNotSupported)

// capabilities are what a driver's init reply says it does; a field the
// reply leaves out has the kubelet's default (attach, selinuxRelabel,
// fsGroup and requiresFSResize true, supportsMetrics false).
type capabilities struct {
	// Attach: the driver's volumes are attached to the node and staged
	// (attach, waitforattach, mountdevice) before they are mounted.
	Attach bool `json:"attach"`
	// SELinuxRelabel: the container runtime may relabel the volume's files.
	SELinuxRelabel bool `json:"selinuxRelabel"`
	// SupportsMetrics: the volume's usage is that of the filesystem at its
	// pod directory (statfs).
	SupportsMetrics bool `json:"supportsMetrics"`
	// FSGroup: after a writable mount for a pod with an fsGroup, that group
	// gets ownership of the volume's files.
	FSGroup bool `json:"fsGroup"`
	// RequiresFSResize: the filesystem is grown on the node after the
	// volume grew.
	RequiresFSResize bool `json:"requiresFSResize"`
}

func defaultCapabilities() capabilities {
	return capabilities{Attach: true, SELinuxRelabel: true, FSGroup: true, RequiresFSResize: true}
}

// reply is a driver's JSON answer.
type reply struct {
	Status     string        `json:"status"`
	Message    string        `json:"message,omitempty"`
	DevicePath string        `json:"device,omitempty"`
	VolumeName string        `json:"volumeName,omitempty"`
	Attached   bool          `json:"attached,omitempty"`
	Caps       *capabilities `json:"capabilities,omitempty"`
}

// call is one run of a driver: its command and arguments.
type call struct {
	command string
	args    []string
}

// run runs the call and returns the driver's reply. Errors, in the
// kubelet's words (volume.Cause is left to the caller):
//   - ErrNotSupported when the driver does not support the command (then
//     or before: the command is remembered and not run again);
//   - "{command} command failed, status: {status}, reason: {message}" for a
//     reply that is neither Success nor Not supported;
//   - the JSON error for output that is no reply;
//   - the exec error for a driver that exits non-zero with a Success reply;
//   - "timeout" (wrapping ctx's error) when ctx ended the call.
func (d *driver) run(ctx context.Context, c call) (*reply, error) {
	if d.isUnsupported(c.command) {
		return nil, errNotSupported
	}
	cmd := d.exec.CommandContext(ctx, d.exe, append([]string{c.command}, c.args...)...)
	out, execErr := cmd.CombinedOutput()
	if execErr != nil && ctx.Err() != nil {
		return nil, fmt.Errorf("timeout: %w", ctx.Err())
	}
	r, err := parseReply(c.command, out)
	switch {
	case errors.Is(err, errNotSupported):
		d.markUnsupported(c.command)
		return nil, err
	case err != nil:
		// Never the arguments: the JSON options may carry secrets.
		klog.FromContext(ctx).V(2).Info("FlexVolume driver call failed", "driver", d.name, "command", c.command, "execError", execErr, "err", err)
		return nil, err
	case execErr != nil:
		klog.FromContext(ctx).Error(execErr, "FlexVolume driver bug: exec error but a Success reply", "driver", d.name, "command", c.command)
		return nil, execErr
	}
	return r, nil
}

// parseReply reads a driver's output, with the kubelet's default
// capabilities where an init reply leaves them out.
func parseReply(command string, out []byte) (*reply, error) {
	caps := defaultCapabilities()
	r := reply{Caps: &caps}
	if err := json.Unmarshal(out, &r); err != nil {
		return nil, fmt.Errorf("reading the reply of command %s (%q): %w", command, truncate(out), err)
	}
	switch r.Status {
	case statusSuccess:
		if r.Caps == nil { // "capabilities": null
			r.Caps = &caps
		}
		return &r, nil
	case statusNotSupported:
		return nil, errNotSupported
	}
	return nil, fmt.Errorf("%s command failed, status: %s, reason: %s", command, r.Status, r.Message)
}

// truncate shortens a driver's output for an error.
func truncate(out []byte) string {
	const max = 512
	if len(out) > max {
		return string(out[:max]) + "..."
	}
	return string(out)
}

func (d *driver) isUnsupported(command string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.unsupported[command]
}

func (d *driver) markUnsupported(command string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.unsupported[command] = true
}
