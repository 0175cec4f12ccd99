package daemon

import (
	"testing"

	"k8s.io/klog/v2/ktesting"

	"github.com/dynamig/dynamig/nvml/sim"
)

// The daemon against the real kubelet and API server (registration, the seed pod's
// PreStartContainer hand-off, reclaim, a lost GPU) is tested in test/kubeletnode
// (daemon_test.go): the race run of deviceplugin/... must not build the API server.

func TestEnableMIGMode(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	s, _ := sim.New(sim.Options{Seed: "n", MigModeNeedsReset: true}, sim.GPUSpec{Model: "A100-40GB", MigDisabled: true}, sim.GPUSpec{Model: "A100-40GB"})
	s.Init()
	if err := enableMIGMode(ctx, s); err != nil {
		t.Fatal(err)
	}
	st := s.Snapshot()
	if st[0].MigEnabled || !st[0].MigPending || !st[1].MigEnabled {
		t.Fatalf("MIG mode must be pending a reset on GPU 0: %+v", st)
	}
	if err := s.ResetGPU(0); err != nil || !s.Snapshot()[0].MigEnabled {
		t.Errorf("after the operator's reset MIG mode is on: %v", err)
	}
}
