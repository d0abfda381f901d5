package subpath

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/mount-utils"
)

func TestSplitSubPath(t *testing.T) {
	long := strings.Repeat("x", maxComponentLength)
	// A path of exactly MaxSubPathLength bytes: components of 255 bytes
	// and a shorter last one, joined by slashes.
	var parts []string
	n := 0
	for n+maxComponentLength+1 <= maxSubPathLength {
		parts = append(parts, long)
		n += maxComponentLength + 1
	}
	parts = append(parts, strings.Repeat("y", maxSubPathLength-n))
	atLimit := strings.Join(parts, "/")
	if len(atLimit) != maxSubPathLength {
		t.Fatalf("test path is %d bytes, want %d", len(atLimit), maxSubPathLength)
	}
	for _, tc := range []struct {
		name, subPath string
		want          []string
		bad           string // a part of the error; "" for none
	}{
		{name: "one component", subPath: "a", want: []string{"a"}},
		{name: "nested", subPath: "a/b/c", want: []string{"a", "b", "c"}},
		{name: "dot is the volume itself", subPath: ".", want: nil},
		{name: "leading dot", subPath: "./a", want: []string{"a"}},
		{name: "trailing slash", subPath: "a/b/", want: []string{"a", "b"}},
		{name: "double slash", subPath: "a//b", want: []string{"a", "b"}},
		{name: "inner dot", subPath: "a/./b", want: []string{"a", "b"}},
		{name: "dots in a name", subPath: "a/..b/c..", want: []string{"a", "..b", "c.."}},
		{name: "component at the limit", subPath: "a/" + long, want: []string{"a", long}},
		{name: "path at the limit", subPath: atLimit, want: parts},
		{name: "empty", subPath: "", bad: "empty"},
		{name: "absolute", subPath: "/etc", bad: "absolute"},
		{name: "dotdot", subPath: "..", bad: `".."`},
		{name: "leading dotdot", subPath: "../a", bad: `".."`},
		{name: "inner dotdot that stays inside", subPath: "a/../b", bad: `".."`},
		{name: "trailing dotdot", subPath: "a/..", bad: `".."`},
		{name: "component over the limit", subPath: "a/" + long + "x", bad: "longer than 255"},
		{name: "path over the limit", subPath: atLimit + "z", bad: "longer than 4095"},
		{name: "NUL", subPath: "a\x00b", bad: "NUL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := splitSubPath(tc.subPath)
			if tc.bad != "" {
				if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.bad) {
					t.Fatalf("splitSubPath(%.40q) = %v, %v; want an ErrInvalid error with %q", tc.subPath, got, err, tc.bad)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("splitSubPath(%.40q) = %.60q, %v; want %.60q", tc.subPath, got, err, tc.want)
			}
		})
	}
}

func TestMountValidate(t *testing.T) {
	ok := Mount{Pod: "uid-1", Volume: "data", VolumePath: "/vol", Container: "app", Index: 0, SubPath: "a"}
	name253 := strings.Repeat("n", 253)
	for _, tc := range []struct {
		name string
		edit func(*Mount)
		bad  string
	}{
		{name: "valid", edit: func(*Mount) {}},
		{name: "names at the limit", edit: func(m *Mount) { m.Pod, m.Volume, m.Container = types.UID(name253), name253, name253 }},
		{name: "pod UID empty", edit: func(m *Mount) { m.Pod = "" }, bad: "pod UID"},
		{name: "pod UID dotdot", edit: func(m *Mount) { m.Pod = ".." }, bad: "pod UID"},
		{name: "pod UID with slash", edit: func(m *Mount) { m.Pod = "a/b" }, bad: "pod UID"},
		{name: "volume over the limit", edit: func(m *Mount) { m.Volume = name253 + "x" }, bad: "volume name"},
		{name: "volume dot", edit: func(m *Mount) { m.Volume = "." }, bad: "volume name"},
		{name: "container with slash", edit: func(m *Mount) { m.Container = "../x" }, bad: "container name"},
		{name: "container over the limit", edit: func(m *Mount) { m.Container = name253 + "x" }, bad: "container name"},
		{name: "negative index", edit: func(m *Mount) { m.Index = -1 }, bad: "index"},
		{name: "relative volume path", edit: func(m *Mount) { m.VolumePath = "vol" }, bad: "volume path"},
		{name: "empty volume path", edit: func(m *Mount) { m.VolumePath = "" }, bad: "volume path"},
		{name: "bad subPath", edit: func(m *Mount) { m.SubPath = "/etc" }, bad: "subPath"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := ok
			tc.edit(&m)
			_, err := m.validate()
			if tc.bad == "" {
				if err != nil {
					t.Fatalf("validate: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.bad) {
				t.Fatalf("validate = %v; want an ErrInvalid error with %q", err, tc.bad)
			}
		})
	}
}

func TestNewRequiresRootAndMounter(t *testing.T) {
	if _, err := New(Config{Mounter: mount.NewFakeMounter(nil)}); !errors.Is(err, ErrInvalid) {
		t.Errorf("New without RootDir = %v, want ErrInvalid", err)
	}
	if _, err := New(Config{RootDir: t.TempDir()}); !errors.Is(err, ErrInvalid) {
		t.Errorf("New without Mounter = %v, want ErrInvalid", err)
	}
}
