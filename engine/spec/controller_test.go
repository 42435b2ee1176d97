package spec

import (
	"testing"
	"time"
)

// runArms drives c for steps decode steps with n running sequences, where
// a step with drafts emits onTokens in onTime and one without emits 1 token
// in offTime; it returns the steps planned with drafts.
func runArms(c *Controller, now *time.Time, n, steps, onTokens int, onTime, offTime time.Duration) int {
	drafted := 0
	for range steps {
		if c.Decide(n) {
			drafted++
			*now = now.Add(onTime)
			c.Observe(onTokens, *now)
		} else {
			*now = now.Add(offTime)
			c.Observe(1, *now)
		}
	}
	return drafted
}

func TestController(t *testing.T) {
	cases := []struct {
		name            string
		onTokens        int
		onTime, offTime time.Duration
		wantOn          bool
	}{
		{"drafts pay", 3, 2 * time.Millisecond, time.Millisecond, true},   // 1500 vs 1000 tok/s
		{"drafts cost", 2, 3 * time.Millisecond, time.Millisecond, false}, // 667 vs 1000 tok/s
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := NewController(16, 8)
			now := time.Unix(0, 0)
			c.Skip(now)
			const steps = 16 * 80
			drafted := runArms(c, &now, 8, steps, tc.onTokens, tc.onTime, tc.offTime)
			off, on := c.Rates(8)
			if off == 0 || on == 0 {
				t.Fatalf("rates %v off, %v on: an arm was never measured", off, on)
			}
			if (on > off) != tc.wantOn {
				t.Errorf("measured %.0f tok/s on, %.0f off", on, off)
			}
			// The winner runs all windows but the first two and one in 8.
			share := float64(drafted) / steps
			if tc.wantOn && share < 0.8 || !tc.wantOn && share > 0.2 {
				t.Errorf("drafts in %.2f of the steps", share)
			}
			if tc.wantOn && share == 1 || !tc.wantOn && share == 0 {
				t.Errorf("the losing arm was never measured again (drafts in %.2f of the steps)", share)
			}
		})
	}
}

// Classes are measured apart: drafts pay at one sequence and cost at 64.
func TestControllerClasses(t *testing.T) {
	c := NewController(8, 8)
	now := time.Unix(0, 0)
	c.Skip(now)
	d1, d64 := 0, 0
	for range 40 {
		d1 += runArms(c, &now, 1, 8, 3, 2*time.Millisecond, time.Millisecond)
		d64 += runArms(c, &now, 64, 8, 2, 4*time.Millisecond, time.Millisecond)
	}
	off1, on1 := c.Rates(1)
	off64, on64 := c.Rates(64)
	if on1 <= off1 || on64 >= off64 {
		t.Errorf("batch 1: %.0f on, %.0f off; batch 64: %.0f on, %.0f off", on1, off1, on64, off64)
	}
	if d1 < 40*8*7/10 || d64 > 40*8*3/10 {
		t.Errorf("drafts in %d of 320 steps at batch 1, %d of 320 at batch 64", d1, d64)
	}
}
