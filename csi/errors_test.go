package csi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/nodevol/nodevol/volume"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestClassify(t *testing.T) {
	inProgress := map[codes.Code]bool{
		codes.Canceled: true, codes.DeadlineExceeded: true, codes.Unavailable: true,
		codes.ResourceExhausted: true, codes.Aborted: true,
	}
	for code := codes.OK + 1; code <= codes.Unauthenticated; code++ {
		t.Run(code.String(), func(t *testing.T) {
			err := classify(context.Background(), "csi.example.com", "NodeStageVolume", status.Error(code, "boom"))
			wrapped := fmt.Errorf("staging volume v: %w", err)
			if got := volume.IsUncertain(wrapped); got != inProgress[code] {
				t.Errorf("IsUncertain = %v, want %v", got, inProgress[code])
			}
			if got := status.Code(wrapped); got != code {
				t.Errorf("status.Code of the wrapped error = %v, want %v", got, code)
			}
			s, ok := status.FromError(wrapped)
			if !ok || s.Code() != code {
				t.Errorf("status.FromError = %v, %v; want code %v", s, ok, code)
			}
			var ce *CallError
			if !errors.As(wrapped, &ce) || ce.Method != "NodeStageVolume" || ce.Driver != "csi.example.com" || ce.Code != code {
				t.Errorf("errors.As(*CallError) = %+v", ce)
			}
			if !strings.Contains(err.Error(), "NodeStageVolume") || !strings.Contains(err.Error(), "csi.example.com") || !strings.Contains(err.Error(), "boom") {
				t.Errorf("error %q does not name the method, driver and cause", err)
			}
		})
	}
}

func TestClassifyTransportAndContext(t *testing.T) {
	err := classify(context.Background(), "d", "NodePublishVolume", io.ErrUnexpectedEOF)
	if !volume.IsUncertain(err) || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("a non-status error: %v: want in progress and wrapping the cause", err)
	}
	if classify(context.Background(), "d", "m", nil) != nil {
		t.Error("classify(nil) != nil")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err = classify(ctx, "d", "NodeStageVolume", status.Error(codes.Canceled, "context canceled"))
	if !errors.Is(err, context.Canceled) || !volume.IsUncertain(err) {
		t.Errorf("caller's context canceled: %v: want errors.Is(context.Canceled) and in progress", err)
	}
}

// TestIsResourceExhausted: a call's ResourceExhausted is seen through the
// wrapping of the operation that made it; other codes and errors without
// a status are not.
func TestIsResourceExhausted(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"ResourceExhausted, wrapped", fmt.Errorf("staging volume v: %w", classify(ctx, "d", "NodeStageVolume", status.Error(codes.ResourceExhausted, "full"))), true},
		{"Unavailable", classify(ctx, "d", "NodeStageVolume", status.Error(codes.Unavailable, "down")), false},
		{"no status", errors.New("full"), false},
		{"nil", nil, false},
	}
	for _, tt := range tests {
		if got := IsResourceExhausted(tt.err); got != tt.want {
			t.Errorf("%s: IsResourceExhausted = %v, want %v", tt.name, got, tt.want)
		}
	}
}
