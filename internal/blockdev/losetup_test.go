package blockdev

import (
	"context"
	"errors"
	"slices"
	"testing"

	"k8s.io/utils/exec"
	testingexec "k8s.io/utils/exec/testing"
)

// fakeLosetup returns a losetup whose runs answer out/err in turn and
// records their arguments.
func fakeLosetup(args *[][]string, answers ...struct {
	out string
	err error
}) Looper {
	fe := &testingexec.FakeExec{}
	for _, a := range answers {
		fe.CommandScript = append(fe.CommandScript, func(cmd string, as ...string) exec.Cmd {
			*args = append(*args, append([]string{cmd}, as...))
			return &testingexec.FakeCmd{CombinedOutputScript: []testingexec.FakeAction{func() ([]byte, []byte, error) { return []byte(a.out), nil, a.err }}}
		})
	}
	return NewLosetup(fe)
}

func TestLosetup(t *testing.T) {
	type answer = struct {
		out string
		err error
	}
	ctx := context.Background()
	tests := []struct {
		name     string
		run      func(Looper) (string, error)
		answer   answer
		want     string
		wantErr  bool
		wantArgs []string
	}{
		{"attach", func(l Looper) (string, error) { return l.Attach(ctx, "/m/uid") }, answer{out: "/dev/loop3\n"}, "/dev/loop3", false, []string{"losetup", "--find", "--show", "/m/uid"}},
		{"find one", func(l Looper) (string, error) { return l.Find(ctx, "/m/uid") }, answer{out: "/dev/loop3: [0005]:12 (/m/uid)\n"}, "/dev/loop3", false, []string{"losetup", "--associated", "/m/uid"}},
		{"find none", func(l Looper) (string, error) { return l.Find(ctx, "/m/uid") }, answer{}, "", false, nil},
		{"find garbage", func(l Looper) (string, error) { return l.Find(ctx, "/m/uid") }, answer{out: "what"}, "", true, nil},
		{"detach fails", func(l Looper) (string, error) { return "", l.Detach(ctx, "/dev/loop3") }, answer{out: "busy", err: errors.New("exit 1")}, "", true, []string{"losetup", "--detach", "/dev/loop3"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var args [][]string
			got, err := tt.run(fakeLosetup(&args, tt.answer))
			if got != tt.want || (err != nil) != tt.wantErr {
				t.Errorf("= %q, %v; want %q, error %v", got, err, tt.want, tt.wantErr)
			}
			if tt.wantArgs != nil && (len(args) != 1 || !slices.Equal(args[0], tt.wantArgs)) {
				t.Errorf("ran %v, want %v", args, tt.wantArgs)
			}
		})
	}
}
