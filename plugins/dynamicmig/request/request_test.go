package request

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/config"
)

func podWith(annotations map[string]string, containers ...v1.ResourceList) *v1.Pod {
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default", Annotations: annotations}}
	for i, limits := range containers {
		p.Spec.Containers = append(p.Spec.Containers, v1.Container{Name: "c" + string(rune('0'+i)), Resources: v1.ResourceRequirements{Limits: limits}})
	}
	return p
}

func TestParsePod(t *testing.T) {
	names := config.DefaultResourceNames()
	q := resource.MustParse
	// withInit is a pod whose one app container asks for a device of 3000 MiB, after the init
	// containers given.
	withInit := func(inits ...v1.Container) *v1.Pod {
		p := podWith(nil, v1.ResourceList{api.ResourceCount: q("1"), api.ResourceMemory: q("3000")})
		p.Spec.InitContainers = inits
		return p
	}
	always := v1.ContainerRestartPolicyAlways
	initAsking := func(name string, restart *v1.ContainerRestartPolicy, limits v1.ResourceList) v1.Container {
		return v1.Container{Name: name, RestartPolicy: restart, Resources: v1.ResourceRequirements{Limits: limits}}
	}
	sidecar := initAsking("sidecar", &always, v1.ResourceList{api.ResourceCount: q("2"), api.ResourceCores: q("30")})
	setup := initAsking("setup", nil, v1.ResourceList{v1.ResourceCPU: q("1")})
	const initRefused = `init container "setup" requests nvidia.com/gpu: dynamig gives GPUs to regular containers and sidecars (init containers with restartPolicy: Always) only; move the GPU request to a sidecar or the main container`
	for _, tc := range []struct {
		name    string
		pod     *v1.Pod
		wantErr string
		check   func(t *testing.T, r *Request)
	}{
		{name: "no GPU", pod: podWith(nil, v1.ResourceList{v1.ResourceCPU: q("1")}), check: func(t *testing.T, r *Request) {
			if r != nil {
				t.Errorf("a CPU pod has no request: %+v", r)
			}
		}},
		{name: "sidecar first", pod: withInit(sidecar), check: func(t *testing.T, r *Request) {
			if len(r.Containers) != 2 || r.Containers[0].Index != 0 || r.Containers[0].Devices != 2 || r.Containers[0].Cores != 30 ||
				r.Containers[1].Index != 1 || r.Containers[1].MemoryMiB != 3000 || r.Devices != 3 {
				t.Errorf("%+v", r.Containers)
			}
		}},
		{name: "init container without GPU counts in the index", pod: withInit(setup, sidecar), check: func(t *testing.T, r *Request) {
			if len(r.Containers) != 2 || r.Containers[0].Index != 1 || r.Containers[0].Devices != 2 || r.Containers[1].Index != 2 || r.Devices != 3 {
				t.Errorf("%+v", r.Containers)
			}
		}},
		{name: "plain init container asking for a GPU", wantErr: initRefused,
			pod: withInit(initAsking("setup", nil, v1.ResourceList{api.ResourceCount: q("1")}))},
		{name: "plain init container asking for GPUs, requests only", wantErr: initRefused, pod: withInit(v1.Container{Name: "setup",
			Resources: v1.ResourceRequirements{Requests: v1.ResourceList{api.ResourceCount: q("1")}}})},
		{name: "plain init container of a pod asking for no other GPU", wantErr: initRefused, pod: func() *v1.Pod {
			p := podWith(nil, v1.ResourceList{v1.ResourceCPU: q("1")})
			p.Spec.InitContainers = []v1.Container{initAsking("setup", nil, v1.ResourceList{api.ResourceCount: q("1")})}
			return p
		}()},
		{name: "plain init container asking for memory and cores", pod: withInit(initAsking("setup", nil, v1.ResourceList{api.ResourceMemory: q("1000"), api.ResourceCores: q("10")})),
			wantErr: `init container "setup" requests nvidia.com/gpumem and nvidia.com/gpucores: dynamig gives GPUs to regular containers and sidecars`},
		{name: "init container with restartPolicy OnFailure is plain", wantErr: `init container "once" requests nvidia.com/gpu and nvidia.com/gpumem-percentage:`,
			pod: withInit(initAsking("once", ptrTo(v1.ContainerRestartPolicyOnFailure), v1.ResourceList{api.ResourceCount: q("1"), api.ResourceMemoryPercentage: q("50")}))},
		{name: "annotations", pod: podWith(map[string]string{
			api.VGPUModeAnnotation: "mig", api.UseGPUTypeAnnotation: "A100, H100", api.NoUseGPUUUIDAnnotation: "GPU-1",
			api.NodeSchedulerPolicyAnnotation: "spread", api.GPUSchedulerPolicyAnnotation: "spread",
		}, v1.ResourceList{api.ResourceCount: q("1")}), check: func(t *testing.T, r *Request) {
			if r.Mode != "mig" || len(r.UseTypes) != 2 || r.UseTypes[1] != "h100" || r.NoUseUUIDs[0] != "GPU-1" || r.NodePolicy != "spread" || r.GPUPolicy != "spread" {
				t.Errorf("%+v", r)
			}
		}},
		{name: "requests without limits", pod: func() *v1.Pod {
			p := podWith(nil, nil)
			p.Spec.Containers[0].Resources.Requests = v1.ResourceList{api.ResourceCount: q("1"), api.ResourceMemoryPercentage: q("50")}
			return p
		}(), check: func(t *testing.T, r *Request) {
			if r.Containers[0].MemoryPercent != 50 {
				t.Errorf("%+v", r.Containers)
			}
		}},
		{name: "memory without count", pod: podWith(nil, v1.ResourceList{api.ResourceMemory: q("1000")}), wantErr: `container "c0" asks for nvidia.com/gpumem without nvidia.com/gpu`},
		{name: "cores without count", pod: podWith(nil, v1.ResourceList{api.ResourceCores: q("10")}), wantErr: "nvidia.com/gpucores without"},
		{name: "negative", pod: podWith(nil, v1.ResourceList{api.ResourceCount: q("1"), api.ResourceMemory: q("-5")}), wantErr: `nvidia.com/gpumem is -5`},
		{name: "fraction", pod: podWith(nil, v1.ResourceList{api.ResourceCount: q("1500m")}), wantErr: "nvidia.com/gpu is 1500m"},
		{name: "whole in millis", pod: podWith(nil, v1.ResourceList{api.ResourceCount: q("1000m"), api.ResourceMemory: q("8e3")}), check: func(t *testing.T, r *Request) {
			if r.Devices != 1 || r.Containers[0].MemoryMiB != 8000 {
				t.Errorf("%+v", r.Containers)
			}
		}},
		{name: "beyond int64", pod: podWith(nil, v1.ResourceList{api.ResourceCount: q("1"), api.ResourceMemory: q("1e100")}), wantErr: "nvidia.com/gpumem is 10e99"},
		{name: "just beyond int64", pod: podWith(nil, v1.ResourceList{api.ResourceCount: q("1"), api.ResourceMemory: q("9223372036854775808")}), wantErr: "nvidia.com/gpumem is 9223372036854775808"},
		{name: "percentage over 100", pod: podWith(nil, v1.ResourceList{api.ResourceCount: q("1"), api.ResourceMemoryPercentage: q("150")}), wantErr: "gpumem-percentage is 150"},
		{name: "cores over 100", pod: podWith(nil, v1.ResourceList{api.ResourceCount: q("1"), api.ResourceCores: q("101")}), wantErr: "gpucores is 101"},
		{name: "negative count", pod: podWith(nil, v1.ResourceList{api.ResourceCount: q("-1")}), wantErr: `container "c0": nvidia.com/gpu is -1; want a non-negative whole number`},
		{name: "negative cores", pod: podWith(nil, v1.ResourceList{api.ResourceCount: q("1"), api.ResourceCores: q("-10")}), wantErr: `container "c0": nvidia.com/gpucores is -10`},
		{name: "bad mode", pod: podWith(map[string]string{api.VGPUModeAnnotation: "mps"}, v1.ResourceList{api.ResourceCount: q("1")}), wantErr: `nvidia.com/vgpu-mode is "mps"`},
		{name: "numa-bind", pod: podWith(map[string]string{api.NUMABindAnnotation: "true"}, v1.ResourceList{api.ResourceCount: q("2")}), check: func(t *testing.T, r *Request) {
			if !r.NUMABind {
				t.Errorf("%+v", r)
			}
		}},
		{name: "numa-bind false", pod: podWith(map[string]string{api.NUMABindAnnotation: "false"}, v1.ResourceList{api.ResourceCount: q("2")}), check: func(t *testing.T, r *Request) {
			if r.NUMABind {
				t.Errorf("%+v", r)
			}
		}},
		{name: "bad numa-bind", pod: podWith(map[string]string{api.NUMABindAnnotation: "yes"}, v1.ResourceList{api.ResourceCount: q("1")}), wantErr: `nvidia.com/numa-bind is "yes"; want true or false`},
		{name: "bad policy", pod: podWith(map[string]string{api.GPUSchedulerPolicyAnnotation: "pack"}, v1.ResourceList{api.ResourceCount: q("1")}), wantErr: `hami.io/gpu-scheduler-policy is "pack"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Parse(tc.pod, names, api.PolicyBinpack)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, r)
		})
	}
}

// TestParseBounds checks the caps on counts, memory and the selector annotations at and just
// over each bound, so that no pod can make Parse, Filter or the fit-cache key costly, or wrap
// the device count.
func TestParseBounds(t *testing.T) {
	names := config.DefaultResourceNames()
	q := resource.MustParse
	gpus := func(counts ...string) *v1.Pod {
		var limits []v1.ResourceList
		for _, c := range counts {
			limits = append(limits, v1.ResourceList{api.ResourceCount: q(c)})
		}
		return podWith(nil, limits...)
	}
	annotated := func(key, value string) *v1.Pod {
		return podWith(map[string]string{key: value}, v1.ResourceList{api.ResourceCount: q("1")})
	}
	// entries is n comma-separated entries, each of the given prefix and its number.
	entries := func(n int, prefix string) string {
		parts := make([]string, n)
		for i := range parts {
			parts[i] = fmt.Sprintf("%s%d", prefix, i)
		}
		return strings.Join(parts, ", ")
	}
	const p62 = "4611686018427387904" // 2^62: four of them wrap int64 to 0
	for _, tc := range []struct {
		name    string
		pod     *v1.Pod
		wantErr string
	}{
		{name: "128 devices", pod: gpus("128")},
		{name: "129 devices", pod: gpus("129"), wantErr: `container "c0": nvidia.com/gpu is 129; at most 128`},
		{name: "2^62 devices", pod: gpus(p62), wantErr: `container "c0": nvidia.com/gpu is ` + p62 + `; at most 128`},
		{name: "four containers of 2^62 devices", pod: gpus(p62, p62, p62, p62), wantErr: `container "c3": nvidia.com/gpu is ` + p62},
		{name: "128 devices in all", pod: gpus("64", "63", "1")},
		{name: "129 devices in all", pod: gpus("64", "64", "1"), wantErr: `containers ask for 129 nvidia.com/gpu in all; at most 128 per pod`},
		{name: "memory at the bound", pod: podWith(nil, v1.ResourceList{api.ResourceCount: q("1"), api.ResourceMemory: q("16777216")})},
		{name: "memory over the bound", pod: podWith(nil, v1.ResourceList{api.ResourceCount: q("1"), api.ResourceMemory: q("16777217")}),
			wantErr: `container "c0": nvidia.com/gpumem is 16777217; at most 16777216 (MiB per device, 16 TiB)`},
		{name: "64 types", pod: annotated(api.UseGPUTypeAnnotation, entries(64, "A"))},
		{name: "65 types", pod: annotated(api.UseGPUTypeAnnotation, entries(65, "A")), wantErr: `annotation nvidia.com/use-gputype: 65 entries, at most 64`},
		{name: "65 excluded types", pod: annotated(api.NoUseGPUTypeAnnotation, entries(65, "A")), wantErr: `annotation nvidia.com/nouse-gputype: 65 entries, at most 64`},
		{name: "empty entries do not count", pod: annotated(api.UseGPUTypeAnnotation, strings.Repeat(",", 200)+entries(64, "A"))},
		{name: "1024 UUIDs", pod: annotated(api.UseGPUUUIDAnnotation, entries(1024, "GPU-"))},
		{name: "1025 UUIDs", pod: annotated(api.UseGPUUUIDAnnotation, entries(1025, "GPU-")), wantErr: `annotation nvidia.com/use-gpuuuid: 1025 entries, at most 1024`},
		{name: "1025 excluded UUIDs", pod: annotated(api.NoUseGPUUUIDAnnotation, entries(1025, "GPU-")), wantErr: `annotation nvidia.com/nouse-gpuuuid: 1025 entries, at most 1024`},
		{name: "85000 UUIDs", pod: annotated(api.NoUseGPUUUIDAnnotation, entries(85000, "G")), wantErr: `annotation nvidia.com/nouse-gpuuuid is `},
		{name: "entry of 128 bytes", pod: annotated(api.UseGPUTypeAnnotation, "A100,"+strings.Repeat("x", 128))},
		{name: "entry of 129 bytes", pod: annotated(api.UseGPUTypeAnnotation, "A100, "+strings.Repeat("x", 129)),
			wantErr: `annotation nvidia.com/use-gputype: entry 2 ("xxxxxxxxxxxxxxxx"…) is 129 bytes, at most 128`},
		{name: "type not UTF-8", pod: annotated(api.UseGPUTypeAnnotation, "A100,\xff"),
			wantErr: `annotation nvidia.com/use-gputype: entry 2 ("\xff"…) is not valid UTF-8`},
		// "Ⱥ" is two bytes and lowercases to "ⱥ", three: 64 of them are kept as 192.
		{name: "type longer once lowercased", pod: annotated(api.UseGPUTypeAnnotation, strings.Repeat("Ⱥ", 64)),
			wantErr: `annotation nvidia.com/use-gputype: entry 1 ("ⱥⱥⱥⱥⱥⱥⱥⱥⱥⱥⱥⱥⱥⱥⱥⱥ"…) is 192 bytes, at most 128`},
		{name: "UUID of 129 bytes", pod: annotated(api.UseGPUUUIDAnnotation, "GPU-"+strings.Repeat("0", 125)),
			wantErr: `annotation nvidia.com/use-gpuuuid: entry 1 ("GPU-000000000000"…) is 129 bytes, at most 128`},
		{name: "annotation of 64 KiB", pod: annotated(api.UseGPUTypeAnnotation, "A100"+strings.Repeat(" ", 64<<10-4))},
		{name: "annotation over 64 KiB", pod: annotated(api.UseGPUTypeAnnotation, "A100"+strings.Repeat(" ", 64<<10-3)),
			wantErr: `annotation nvidia.com/use-gputype is 65537 bytes, at most 65536`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Parse(tc.pod, names, api.PolicyBinpack)
			if tc.wantErr == "" {
				if err != nil || r == nil {
					t.Fatalf("got %v, %v; want a request", r, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("request %t, error %v; want %q", r != nil, err, tc.wantErr)
			}
		})
	}
}

// TestParseNormalises checks that the selectors reach the allocator trimmed, types lowercased,
// UUIDs as written but sorted and without duplicates, so that Filter only compares.
func TestParseNormalises(t *testing.T) {
	pod := podWith(map[string]string{
		api.UseGPUTypeAnnotation: " A100 ,,H100-SXM ", api.NoUseGPUTypeAnnotation: "PCIe",
		api.UseGPUUUIDAnnotation: " GPU-AbC , GPU-1,GPU-AbC", api.NoUseGPUUUIDAnnotation: "GPU-2 ,",
	}, v1.ResourceList{api.ResourceCount: resource.MustParse("1")})
	r, err := Parse(pod, config.DefaultResourceNames(), api.PolicyBinpack)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		field     string
		got, want []string
	}{
		{"UseTypes", r.UseTypes, []string{"a100", "h100-sxm"}},
		{"NoUseTypes", r.NoUseTypes, []string{"pcie"}},
		{"UseUUIDs", r.UseUUIDs, []string{"GPU-1", "GPU-AbC"}},
		{"NoUseUUIDs", r.NoUseUUIDs, []string{"GPU-2"}},
	} {
		if !slices.Equal(c.got, c.want) {
			t.Errorf("%s = %q, want %q", c.field, c.got, c.want)
		}
	}
}

var longExponent = regexp.MustCompile(`[eE][+-]?[0-9]{4}`)

func FuzzParsePod(f *testing.F) {
	f.Add("mig", "A100,H100", "binpack", "2", "8000", "50", "30")
	f.Add("", "", "", "1500m", "-1", "101", "1e3")
	// Invalid UTF-8 grew threefold when lowercased, past the entry bound.
	f.Add("", strings.Repeat("0\xf0", 64), "", "1", "", "", "")
	f.Add("", "", "", "1", "1e100", "1000m", "1e-999")
	f.Fuzz(func(t *testing.T, mode, types, policy, count, mem, pct, cores string) {
		limits := v1.ResourceList{}
		for name, v := range map[string]string{api.ResourceCount: count, api.ResourceMemory: mem, api.ResourceMemoryPercentage: pct, api.ResourceCores: cores} {
			// ParseQuantity's time grows with the exponent (1e-999999 takes 44 ms, 1e-99999999
			// hung CI's fuzz worker); a pod's quantities come parsed by the API server.
			if longExponent.MatchString(v) {
				continue
			}
			if q, err := resource.ParseQuantity(v); err == nil {
				limits[v1.ResourceName(name)] = q
			}
		}
		pod := podWith(map[string]string{api.VGPUModeAnnotation: mode, api.UseGPUTypeAnnotation: types, api.NodeSchedulerPolicyAnnotation: policy}, limits)
		r, err := Parse(pod, config.DefaultResourceNames(), api.PolicyBinpack)
		if err != nil {
			if !strings.Contains(err.Error(), "container") && !strings.Contains(err.Error(), "annotation") {
				t.Fatalf("error names neither container nor annotation: %v", err)
			}
			return
		}
		if r != nil && (r.Devices <= 0 || r.Mode != "" && r.Mode != api.ModeMIG && r.Mode != api.ModeHAMiCore) {
			t.Fatalf("accepted a bad request: %+v", r)
		}
		if r == nil {
			return
		}
		for _, c := range r.Containers {
			if c.MemoryMiB < 0 || c.MemoryPercent > 100 || c.Cores > 100 || c.Devices <= 0 {
				t.Fatalf("accepted a bad container: %+v", c)
			}
		}
		if len(r.UseTypes) > 64 {
			t.Fatalf("accepted %d types", len(r.UseTypes))
		}
		for _, typ := range r.UseTypes {
			if typ == "" || len(typ) > 128 || typ != strings.ToLower(strings.TrimSpace(typ)) {
				t.Fatalf("type %q is not normalised", typ)
			}
		}
	})
}

func ptrTo[T any](v T) *T { return &v }
