package api

import (
	"reflect"
	"strings"
	"testing"
)

func TestHAMiCoreDevicesRoundTrip(t *testing.T) {
	in := [][]HAMiCoreDevice{
		nil,
		{{UUID: "GPU-1", Type: "NVIDIA A100-PCIE-40GB", MemoryMiB: 3000, Cores: 30}, {UUID: "GPU-2", Type: "NVIDIA", MemoryMiB: 0, Cores: 0}},
	}
	raw := EncodeHAMiCoreDevices(in)
	if raw != ";GPU-1,NVIDIA A100-PCIE-40GB,3000,30:GPU-2,NVIDIA,0,0:;" {
		t.Fatalf("encoded %q", raw)
	}
	out, err := DecodeHAMiCoreDevices(DevicesAllocatedAnnotation, raw)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 2 || len(out[0]) != 0 || !reflect.DeepEqual(out[1], in[1]) {
		t.Errorf("decoded %+v", out)
	}
	for raw, want := range map[string]string{
		"GPU-1,NVIDIA,x,1:;":   "memory",
		"GPU-1,NVIDIA,1,-1:;":  "cores",
		"GPU-1,NVIDIA,1:;":     "want UUID,Type,memory,cores",
		",NVIDIA,1,1:;":        "empty GPU UUID",
		";;GPU-1,NVIDIA,1,y:;": "container 2 device 0",
	} {
		if _, err := DecodeHAMiCoreDevices("k", raw); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", raw, err, want)
		}
	}
}

func FuzzDecodeHAMiCoreDevices(f *testing.F) {
	f.Add(";GPU-1,NVIDIA A100-PCIE-40GB,3000,30:GPU-2,NVIDIA,0,0:;")
	f.Add("GPU-1,NVIDIA,1,1:")
	f.Fuzz(func(t *testing.T, raw string) {
		out, err := DecodeHAMiCoreDevices("k", raw)
		if err != nil {
			return
		}
		again, err := DecodeHAMiCoreDevices("k", EncodeHAMiCoreDevices(out))
		if err != nil {
			t.Fatalf("re-decode: %v", err)
		}
		if len(again) != len(out) {
			t.Fatalf("containers %d != %d", len(again), len(out))
		}
	})
}
