package driver

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	utilexec "k8s.io/utils/exec"
)

// loopDevices attaches image files to loop devices. The driver never
// remembers a device number across calls: it asks Find, because device
// numbers are handed out again after a detach or a reboot.
type loopDevices interface {
	// Find returns the loop devices backed by image, oldest first; none
	// is not an error.
	Find(ctx context.Context, image string) ([]string, error)
	// Attach attaches image to a free loop device and returns it.
	Attach(ctx context.Context, image string) (string, error)
	// Detach detaches device. While something else still has the device
	// open (udev's or blkid's probe, another losetup scanning devices),
	// the kernel only marks it and detaches it at its last close: Detach
	// then succeeds and the device stays attached for a while, with
	// Detaching true.
	Detach(ctx context.Context, device string) error
	// Detaching reports whether device is attached but marked to be
	// detached at its last close. A device that is not attached is not
	// detaching.
	Detaching(ctx context.Context, device string) (bool, error)
	// Refresh makes device pick up a new size of its backing image.
	Refresh(ctx context.Context, device string) error
}

// losetup is loopDevices done with util-linux's losetup(8).
type losetup struct {
	exec utilexec.Interface
}

var _ loopDevices = losetup{}

func (l losetup) run(ctx context.Context, args ...string) (string, error) {
	out, err := l.exec.CommandContext(ctx, "losetup", args...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("losetup %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

func (l losetup) Find(ctx context.Context, image string) ([]string, error) {
	out, err := l.run(ctx, "--list", "--noheadings", "--output", "NAME", "--associated", image)
	if err != nil {
		return nil, err
	}
	return parseDeviceList(out), nil
}

func (l losetup) Attach(ctx context.Context, image string) (string, error) {
	out, err := l.run(ctx, "--find", "--show", image)
	if err != nil {
		return "", err
	}
	devs := parseDeviceList(out)
	if len(devs) != 1 {
		return "", fmt.Errorf("losetup --find --show %s: unexpected output %q", image, out)
	}
	return devs[0], nil
}

func (l losetup) Detach(ctx context.Context, device string) error {
	_, err := l.run(ctx, "--detach", device)
	return err
}

// Detaching reads the device's autoclear flag in sysfs: LOOP_CLR_FD sets
// it on a device that is open elsewhere, and the driver never attaches
// with it. Unlike losetup it opens no device, so it cannot itself hold
// up the detach it looks at.
func (l losetup) Detaching(_ context.Context, device string) (bool, error) {
	name := filepath.Base(device)
	if !strings.HasPrefix(name, "loop") {
		return false, fmt.Errorf("%s is not a loop device", device)
	}
	b, err := os.ReadFile(filepath.Join("/sys/block", name, "loop", "autoclear"))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil // not attached (sysfs has no loop/ directory then)
	}
	if err != nil {
		return false, err
	}
	return strings.TrimSpace(string(b)) == "1", nil
}

func (l losetup) Refresh(ctx context.Context, device string) error {
	_, err := l.run(ctx, "--set-capacity", device)
	return err
}

// parseDeviceList returns the /dev/loopN names in losetup's output, one
// per line, ignoring anything else.
func parseDeviceList(out string) []string {
	var devs []string
	for line := range strings.Lines(out) {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "/dev/loop") && !strings.ContainsAny(line, " \t:") {
			devs = append(devs, line)
		}
	}
	return devs
}
