package driver

import (
	"context"
	"fmt"
	"strings"

	utilexec "k8s.io/utils/exec"
)

// LoopDevices attaches image files to loop devices. The driver never
// remembers a device number across calls: it asks Find, because device
// numbers are handed out again after a detach or a reboot.
type LoopDevices interface {
	// Find returns the loop devices backed by image, oldest first; none
	// is not an error.
	Find(ctx context.Context, image string) ([]string, error)
	// Attach attaches image to a free loop device and returns it.
	Attach(ctx context.Context, image string) (string, error)
	// Detach detaches device.
	Detach(ctx context.Context, device string) error
	// Refresh makes device pick up a new size of its backing image.
	Refresh(ctx context.Context, device string) error
}

// losetup is LoopDevices done with util-linux's losetup(8).
type losetup struct {
	exec utilexec.Interface
}

var _ LoopDevices = losetup{}

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
