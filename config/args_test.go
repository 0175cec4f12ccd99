package config

import (
	"strings"
	"testing"
)

func TestDynamicMIGArgsDefaults(t *testing.T) {
	args, err := DecodeDynamicMIGArgs(nil)
	if err != nil {
		t.Fatal(err)
	}
	if args.ResourceCountName != "nvidia.com/gpu" || args.NodeSchedulerPolicy != "binpack" ||
		args.MIGGPUSchedulerPolicy != "binpack" || args.HAMiCoreGPUSchedulerPolicy != "spread" ||
		args.LeaseNamespace != "dynamig-system" || args.SigningKeyNamespace != "dynamig-signing" ||
		args.MetricsBindAddress != ":9395" || !*args.FragmentationAware || !*args.CreateSigningKey || args.LegacyMetrics {
		t.Errorf("defaults: %+v", args)
	}
	cp := args.DeepCopyObject().(*DynamicMIGArgs)
	*cp.FragmentationAware, *cp.CreateSigningKey = false, false
	if !*args.FragmentationAware || !*args.CreateSigningKey {
		t.Errorf("DeepCopyObject shares FragmentationAware or CreateSigningKey")
	}
}

func TestDecodeDynamicMIGArgs(t *testing.T) {
	args, err := DecodeDynamicMIGArgs([]byte(`{"kind":"DynamicMIGArgs","apiVersion":"kubescheduler.config.k8s.io/v1","leaseNamespace":"gpu-system","fragmentationAware":false,"nodeSchedulerPolicy":"spread"}`))
	if err != nil {
		t.Fatal(err)
	}
	if args.LeaseNamespace != "gpu-system" || *args.FragmentationAware || args.NodeSchedulerPolicy != "spread" {
		t.Errorf("decoded: %+v", args)
	}
	for _, tc := range []struct{ doc, want string }{
		{"nodeSchedulerPolicy: pack", "nodeSchedulerPolicy"},
		{"migGPUSchedulerPolicy: x", "migGPUSchedulerPolicy"},
		{"signingKeyNamespace: Bad_NS", "signingKeyNamespace"},
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
