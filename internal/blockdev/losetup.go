package blockdev

import (
	"context"
	"fmt"
	"strings"

	"k8s.io/utils/exec"
)

// losetup is a Looper that runs losetup(8).
type losetup struct{ exec exec.Interface }

// NewLosetup returns a Looper that runs losetup through e (default exec.New()).
func NewLosetup(e exec.Interface) Looper {
	if e == nil {
		e = exec.New()
	}
	return losetup{exec: e}
}

func (l losetup) run(ctx context.Context, args ...string) (string, error) {
	out, err := l.exec.CommandContext(ctx, "losetup", args...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("losetup %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return strings.TrimSpace(string(out)), nil
}

// Attach implements Looper.
func (l losetup) Attach(ctx context.Context, path string) (string, error) {
	return l.run(ctx, "--find", "--show", path)
}

// Find implements Looper: the first device losetup --associated lists.
func (l losetup) Find(ctx context.Context, path string) (string, error) {
	out, err := l.run(ctx, "--associated", path)
	if err != nil || out == "" {
		return "", err
	}
	dev, _, ok := strings.Cut(strings.SplitN(out, "\n", 2)[0], ":")
	if !ok || !strings.HasPrefix(dev, "/dev/") {
		return "", fmt.Errorf("losetup --associated %s: unexpected output %q", path, out)
	}
	return dev, nil
}

// Detach implements Looper.
func (l losetup) Detach(ctx context.Context, dev string) error {
	_, err := l.run(ctx, "--detach", dev)
	return err
}
