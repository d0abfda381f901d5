package pluginmanager

import (
	"testing"
	"time"
)

func TestPlan(t *testing.T) {
	now := time.Unix(1000, 0)
	later, earlier := now.Add(time.Second), now.Add(-time.Second)
	d := func(gen uint64) *desiredPlugin { return &desiredPlugin{gen: gen} }
	a := func(gen uint64) *actualPlugin { return &actualPlugin{gen: gen} }
	tests := []struct {
		name     string
		d        *desiredPlugin
		a        *actualPlugin
		b        *retry
		want     step
		wantWake time.Time
	}{
		{name: "nothing", want: stepNone},
		{name: "new socket", d: d(1), want: stepRegister},
		{name: "registered", d: d(1), a: a(1), want: stepNone},
		{name: "socket gone", a: a(1), want: stepDeregister},
		{name: "socket re-created: deregister first", d: d(2), a: a(1), want: stepDeregister},
		{name: "registration backoff pending", d: d(1), b: &retry{gen: 1, until: later}, want: stepWait, wantWake: later},
		{name: "registration backoff expired", d: d(1), b: &retry{gen: 1, until: earlier}, want: stepRegister},
		{name: "registration backoff at expiry", d: d(1), b: &retry{gen: 1, until: now}, want: stepRegister},
		{name: "backoff of an older socket", d: d(2), b: &retry{gen: 1, until: later}, want: stepRegister},
		{name: "deregistration backoff pending", a: a(1), b: &retry{dereg: true, gen: 1, until: later}, want: stepWait, wantWake: later},
		{name: "registration backoff does not delay deregistration", d: d(2), a: a(1), b: &retry{gen: 2, until: later}, want: stepDeregister},
		{name: "deregistration backoff does not delay registration", d: d(2), b: &retry{dereg: true, gen: 1, until: later}, want: stepRegister},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, wake := plan(tt.d, tt.a, tt.b, now)
			if got != tt.want || !wake.Equal(tt.wantWake) {
				t.Errorf("plan = %v, %v; want %v, %v", got, wake, tt.want, tt.wantWake)
			}
		})
	}
}

func TestBackoffApplies(t *testing.T) {
	d1, d2 := &desiredPlugin{gen: 1}, &desiredPlugin{gen: 2}
	a1 := &actualPlugin{gen: 1}
	reg1, dereg1 := &retry{gen: 1}, &retry{dereg: true, gen: 1}
	cases := []struct {
		name string
		b    *retry
		d    *desiredPlugin
		a    *actualPlugin
		want bool
	}{
		{"registration of the current socket", reg1, d1, nil, true},
		{"registration of an older socket", reg1, d2, nil, false},
		{"registration when registered", reg1, d1, a1, false},
		{"registration when socket gone", reg1, nil, nil, false},
		{"deregistration of a gone socket", dereg1, nil, a1, true},
		{"deregistration of a replaced socket", dereg1, d2, a1, true},
		{"deregistration when socket back", dereg1, d1, a1, false},
	}
	for _, c := range cases {
		if got := c.b.applies(c.d, c.a); got != c.want {
			t.Errorf("%s: applies = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestOptionsDefaults(t *testing.T) {
	if _, err := New(Options{}); err == nil {
		t.Error("New without Dir: want error")
	}
	if _, err := New(Options{Dir: "/x"}); err == nil {
		t.Error("New without handlers: want error")
	}
	if _, err := New(Options{Dir: "/x", Handlers: map[string]Handler{"CSIPlugin": nil}}); err == nil {
		t.Error("New with nil handler: want error")
	}
	m, err := New(Options{Dir: "x/../y", Handlers: map[string]Handler{"CSIPlugin": &fakeHandler{}}})
	if err != nil {
		t.Fatal(err)
	}
	o := m.opts
	if o.Clock == nil || o.RPCTimeout != defaultRPCTimeout || o.HandlerTimeout != defaultHandlerTimeout ||
		o.InitialBackoff != defaultInitialBackoff || o.MaxBackoff != defaultMaxBackoff || o.ResyncPeriod != defaultResyncPeriod {
		t.Errorf("defaults not filled in: %+v", o)
	}
	if o.Dir[0] != '/' {
		t.Errorf("Dir %q not made absolute", o.Dir)
	}
}
