package health

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/dynamig/dynamig/nvml/sim"
)

func TestXIDsAndRecovery(t *testing.T) {
	s, err := sim.New(sim.Options{Seed: "n"}, sim.GPUSpec{Model: "A100-40GB"}, sim.GPUSpec{Model: "A100-40GB"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Init(); err != nil {
		t.Fatal(err)
	}
	gpus := s.Snapshot()
	m := New(s, DefaultIgnoredXIDs)
	m.Recheck = 50 * time.Millisecond
	var mu sync.Mutex
	var changes []Change
	m.OnChange = func(c Change) { mu.Lock(); changes = append(changes, c); mu.Unlock() }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = m.Run(ctx) }()
	defer func() { cancel(); <-done }()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s; unhealthy %v", what, m.Unhealthy())
			}
		}
	}
	time.Sleep(100 * time.Millisecond) // registered
	// An application's XID leaves the GPU healthy.
	s.InjectXID(1, 31, 1, 0)
	// XID 79 (fallen off the bus) with a reset pending makes GPU 0 unhealthy, and it stays
	// so while NVML says a reset is pending.
	s.SetResetPending(0, true)
	s.InjectXID(0, 79, -1, -1)
	waitFor("GPU 0 unhealthy", func() bool { return m.Unhealthy()[gpus[0].UUID] == "XID 79" })
	time.Sleep(200 * time.Millisecond)
	if got := m.Unhealthy(); len(got) != 1 {
		t.Fatalf("unhealthy %v, want only GPU 0 (XID 31 is an application's)", got)
	}
	s.SetResetPending(0, false) // reset
	waitFor("GPU 0 healthy again", func() bool { return len(m.Unhealthy()) == 0 })
	// A double-bit ECC error on GPU 1; lost, NVML cannot say it is healthy.
	s.LoseGPU(1)
	s.InjectDoubleBitECC(1)
	waitFor("GPU 1 unhealthy", func() bool { return m.Unhealthy()[gpus[1].UUID] == "double-bit ECC error" })
	time.Sleep(200 * time.Millisecond)
	if _, still := m.Unhealthy()[gpus[1].UUID]; !still {
		t.Fatal("a GPU NVML cannot answer for is never healthy again")
	}
	s.RecoverGPU(1)
	waitFor("GPU 1 healthy again", func() bool { return len(m.Unhealthy()) == 0 })
	mu.Lock()
	defer mu.Unlock()
	if len(changes) != 4 || changes[0].Healthy || !changes[1].Healthy || changes[2].Healthy || !changes[3].Healthy {
		t.Errorf("changes %+v", changes)
	}
}
