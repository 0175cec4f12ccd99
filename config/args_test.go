package config

import (
	"strings"
	"testing"
	"time"
)

func TestDynamicMIGArgsDefaults(t *testing.T) {
	args, err := DecodeDynamicMIGArgs(nil)
	if err != nil {
		t.Fatal(err)
	}
	if args.ResourceCountName != "nvidia.com/gpu" || args.NodeSchedulerPolicy != "binpack" ||
		args.MIGGPUSchedulerPolicy != "binpack" || args.HAMiCoreGPUSchedulerPolicy != "spread" ||
		args.LeaseNamespace != "dynamig-system" || args.HandoffLeaseDurationSeconds != 60 ||
		args.HandoffTimeout.Duration != 2*time.Minute || args.MetricsBindAddress != ":9395" ||
		!*args.FragmentationAware || args.LegacyMetrics {
		t.Errorf("defaults: %+v", args)
	}
	cp := args.DeepCopyObject().(*DynamicMIGArgs)
	*cp.FragmentationAware = false
	if !*args.FragmentationAware {
		t.Errorf("DeepCopyObject shares FragmentationAware")
	}
}

func TestDecodeDynamicMIGArgs(t *testing.T) {
	args, err := DecodeDynamicMIGArgs([]byte(`{"kind":"DynamicMIGArgs","apiVersion":"kubescheduler.config.k8s.io/v1","handoffTimeout":"30s","fragmentationAware":false,"nodeSchedulerPolicy":"spread"}`))
	if err != nil {
		t.Fatal(err)
	}
	if args.HandoffTimeout.Duration != 30*time.Second || *args.FragmentationAware || args.NodeSchedulerPolicy != "spread" {
		t.Errorf("decoded: %+v", args)
	}
	for _, tc := range []struct{ doc, want string }{
		{"nodeSchedulerPolicy: pack", "nodeSchedulerPolicy"},
		{"migGPUSchedulerPolicy: x", "migGPUSchedulerPolicy"},
		{"handoffTimeout: -1s", "handoffTimeout"},
		{"handoffTimeout: soon", "handoffTimeout"},
		{"handoffLeaseDurationSeconds: 7200", "handoffLeaseDurationSeconds"},
		{"leaseNamespace: Bad_NS", "leaseNamespace"},
		{"metricsBindAddress: nine", "metricsBindAddress"},
		{"resourceCoreName: cores", "resourceCoreName"},
		{"fragmentationAwareness: true", "fragmentationAwareness"},
	} {
		if _, err := DecodeDynamicMIGArgs([]byte(tc.doc)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v should name %s", tc.doc, err, tc.want)
		}
	}
}
