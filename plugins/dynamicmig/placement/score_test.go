package placement

import (
	"testing"

	"github.com/dynamig/dynamig/api"
)

// TestNodeScoreHost: binpack ranks by fragmentation cost, then being in use, then the host's
// CPU and memory fullness by tenths (a difference under a twentieth leaves the node order to
// decide); spread prefers the emptier host; a pod without GPU request is ranked by its host
// alone.
func TestNodeScoreHost(t *testing.T) {
	binpack := func(hostUtil float64, inUse bool, cost int) int64 {
		return NodeScore(0.5, hostUtil, inUse, cost, api.PolicyBinpack, true)
	}
	for _, tc := range []struct {
		name          string
		better, worse int64
	}{
		{"the fuller host", binpack(0.5, false, 0), binpack(0.1, false, 0)},
		{"in use over a fuller host", binpack(0, true, 0), binpack(1, false, 0)},
		{"less cost over in use and a full host", binpack(0, false, 0), binpack(1, true, 1)},
		{"spread: the emptier host", NodeScore(0.5, 0.1, false, 0, api.PolicySpread, true), NodeScore(0.5, 0.5, false, 0, api.PolicySpread, true)},
		{"no GPU, binpack: the fuller host", HostScore(0.6, api.PolicyBinpack), HostScore(0.2, api.PolicyBinpack)},
		{"no GPU, spread: the emptier host", HostScore(0.2, api.PolicySpread), HostScore(0.6, api.PolicySpread)},
	} {
		if tc.better <= tc.worse {
			t.Errorf("%s: %d is not above %d", tc.name, tc.better, tc.worse)
		}
	}
	if binpack(0.31, false, 0) != binpack(0.34, false, 0) {
		t.Error("binpack tells hosts apart by tenths only")
	}
}
