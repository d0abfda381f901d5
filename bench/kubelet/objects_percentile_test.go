package kubeletbench

import (
	"math"
	"testing"
	"time"
)

func TestObjectsPercentileMs(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		var out []time.Duration
		for _, x := range v {
			out = append(out, time.Duration(x)*time.Millisecond)
		}
		return out
	}
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = 100 - i
	}
	tests := []struct {
		name string
		d    []time.Duration
		q    float64
		want float64
	}{
		{"one", ms(7), 0.99, 7},
		{"median of an odd count, unsorted", ms(30, 10, 20), 0.5, 20},
		{"median of an even count: the lower", ms(40, 10, 30, 20), 0.5, 20},
		{"p99 of 100: the 99th", ms(hundred...), 0.99, 99},
		{"p99 of 50: the last", ms(hundred[50:]...), 0.99, 50},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := percentileMs(tt.d, tt.q); got != tt.want {
				t.Errorf("percentileMs = %v, want %v", got, tt.want)
			}
		})
	}
	if got := percentileMs(nil, 0.5); !math.IsNaN(got) {
		t.Errorf("percentileMs(nil) = %v, want NaN", got)
	}
}
