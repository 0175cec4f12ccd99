package placement

import (
	"fmt"

	"github.com/dynamig/dynamig/api"
)

// HasGPUOfMode tells whether an inventory has a GPU of mode ("": of either): DynamicMIG's
// PreFilter hands kube-scheduler only such nodes (and those whose inventory does not decode);
// no pod's removal makes a GPU pod fit anywhere else.
func HasGPUOfMode(gpus []api.GPU, mode string) bool {
	for i := range gpus {
		if mode == "" || gpus[i].Mode == mode {
			return true
		}
	}
	return false
}

// NoGPUNodeMessage is DynamicMIG's PreFilter refusal of a pod when no node has a GPU of its
// mode.
func NoGPUNodeMessage(mode string) string {
	if mode == "" {
		return "no node publishes a GPU inventory (no dynamig-device-plugin runs)"
	}
	return fmt.Sprintf("no node publishes a GPU inventory with a %s GPU (no dynamig-device-plugin runs, or none in that mode)", mode)
}
