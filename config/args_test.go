package config

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

func TestDynamicMIGArgsDefaults(t *testing.T) {
	args, err := DecodeDynamicMIGArgs(nil)
	if err != nil {
		t.Fatal(err)
	}
	if args.ResourceCountName != "nvidia.com/gpu" || args.NodeSchedulerPolicy != "binpack" ||
		args.MIGGPUSchedulerPolicy != "binpack" || args.HAMiCoreGPUSchedulerPolicy != "spread" ||
		args.LeaseNamespace != "dynamig-system" || args.SigningKeyNamespace != "dynamig-signing" ||
		args.MetricsBindAddress != ":9395" || !*args.FragmentationAware || !*args.CreateSigningKey || args.LegacyMetrics ||
		args.Relocation.Enabled || args.Relocation.Interval.Duration != 10*time.Minute || args.Relocation.MaxPods != 3 {
		t.Errorf("defaults: %+v", args)
	}
	cp := args.DeepCopyObject().(*DynamicMIGArgs)
	*cp.FragmentationAware, *cp.CreateSigningKey = false, false
	if !*args.FragmentationAware || !*args.CreateSigningKey {
		t.Errorf("DeepCopyObject shares FragmentationAware or CreateSigningKey")
	}
}

func TestDecodeDynamicMIGArgs(t *testing.T) {
	args, err := DecodeDynamicMIGArgs([]byte(`{"kind":"DynamicMIGArgs","apiVersion":"kubescheduler.config.k8s.io/v1","leaseNamespace":"gpu-system","fragmentationAware":false,"nodeSchedulerPolicy":"spread","relocation":{"enabled":true,"interval":"90s"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if args.LeaseNamespace != "gpu-system" || *args.FragmentationAware || args.NodeSchedulerPolicy != "spread" ||
		!args.Relocation.Enabled || args.Relocation.Interval.Duration != 90*time.Second {
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
		{"relocation: {interval: -1m}", `relocation.interval: Invalid value: "-1m0s": must not be negative`},
		{"relocation: {maxPods: 8}", "relocation.maxPods: Invalid value: 8: must be 1 to 7"},
		{"relocation: {enable: true}", "enable"},
	} {
		if _, err := DecodeDynamicMIGArgs([]byte(tc.doc)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v should name %s", tc.doc, err, tc.want)
		}
	}
}

// FuzzDecodeDynamicMIGArgs: the plugin's args as a user writes them in pluginConfig. Never a
// panic; what decodes is valid, and decoding is stable (the args re-encoded decode equal).
func FuzzDecodeDynamicMIGArgs(f *testing.F) {
	f.Add([]byte(`{}`))
	f.Add([]byte("migGPUSchedulerPolicy: binpack\nhamiCoreGPUSchedulerPolicy: spread\nnodeSchedulerPolicy: binpack\nresourceCountName: nvidia.com/gpu\n"))
	f.Add([]byte(`{"fragmentationAware": false, "resourceMemoryName": ""}`))
	f.Add([]byte("migGPUSchedulerPolicy: [1, 2]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		args, err := DecodeDynamicMIGArgs(data)
		if err != nil {
			return
		}
		if errs := args.Validate(); len(errs) > 0 {
			t.Fatalf("decoded args are invalid: %v", errs)
		}
		raw, err := yaml.Marshal(args)
		if err != nil {
			t.Fatal(err)
		}
		again, err := DecodeDynamicMIGArgs(raw)
		if err != nil {
			t.Fatalf("re-decoding %s: %v", raw, err)
		}
		if !reflect.DeepEqual(args, again) {
			t.Fatalf("decode is not stable: %+v → %+v", args, again)
		}
	})
}
