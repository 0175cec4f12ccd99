package podresources

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// lister answers List with fixed pod resources. (The real kubelet's answer is tested in
// test/kubeletnode.)
type lister struct {
	podresourcesv1.PodResourcesListerClient
	pods []*podresourcesv1.PodResources
}

func (l lister) List(context.Context, *podresourcesv1.ListPodResourcesRequest, ...grpc.CallOption) (*podresourcesv1.ListPodResourcesResponse, error) {
	return &podresourcesv1.ListPodResourcesResponse{PodResources: l.pods}, nil
}

func ctr(name string, devs ...*podresourcesv1.ContainerDevices) *podresourcesv1.ContainerResources {
	return &podresourcesv1.ContainerResources{Name: name, Devices: devs}
}

func devs(resource string, ids ...string) *podresourcesv1.ContainerDevices {
	return &podresourcesv1.ContainerDevices{ResourceName: resource, DeviceIds: ids}
}

func TestFind(t *testing.T) {
	c := &Client{lister: lister{pods: []*podresourcesv1.PodResources{
		{Name: "a", Namespace: "ns", Containers: []*podresourcesv1.ContainerResources{
			ctr("sidecar", devs("nvidia.com/gpu", "g::1")),
			ctr("main", devs("nvidia.com/gpu", "g::3", "g::2"), devs("example.com/nic", "n0")),
		}},
		{Name: "b", Namespace: "ns", Containers: []*podresourcesv1.ContainerResources{ctr("main", devs("nvidia.com/gpu", "g::5"))}},
		{Name: "c", Namespace: "ns", Containers: []*podresourcesv1.ContainerResources{ctr("main", devs("nvidia.com/gpu", "g::5"))}},
	}}}
	for _, tc := range []struct {
		name    string
		ids     []string
		want    Owner
		wantErr string
	}{
		{"one device", []string{"g::1"}, Owner{"ns", "a", "sidecar"}, ""},
		{"several, any order; other resources ignored", []string{"g::2", "g::3"}, Owner{"ns", "a", "main"}, ""},
		{"a subset is not the container's set", []string{"g::2"}, Owner{}, "no active container holds nvidia.com/gpu devices [g::2]"},
		{"nobody", []string{"g::9"}, Owner{}, "no active container holds"},
		{"two holders", []string{"g::5"}, Owner{}, "held by 2 containers (ns/b container main, ns/c container main)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := c.Find(context.Background(), "nvidia.com/gpu", tc.ids)
			if got != tc.want || (tc.wantErr == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Find(%v) = %v, %v; want %v, %q", tc.ids, got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestHeld(t *testing.T) {
	c := &Client{lister: lister{pods: []*podresourcesv1.PodResources{
		{Name: "a", Namespace: "ns", Containers: []*podresourcesv1.ContainerResources{
			ctr("sidecar", devs("nvidia.com/gpu", "g::1")),
			ctr("main", devs("nvidia.com/gpu", "g::3", "g::2"), devs("example.com/nic", "n0")),
		}},
		{Name: "b", Namespace: "ns", Containers: []*podresourcesv1.ContainerResources{ctr("main")}},
	}}}
	got, err := c.Held(context.Background(), "nvidia.com/gpu")
	if want := []string{"g::1", "g::2", "g::3"}; err != nil || !slices.Equal(slices.Sorted(maps.Keys(got)), want) {
		t.Errorf("Held = %v, %v; want %v", got, err, want)
	}
}

// FuzzOwner decodes arbitrary bytes as the kubelet's List answer (the wire format the
// PodResources socket carries) and attributes device IDs in it: never a panic, and an owner
// found holds exactly the IDs asked for.
func FuzzOwner(f *testing.F) {
	seed, _ := proto.Marshal(&podresourcesv1.ListPodResourcesResponse{PodResources: []*podresourcesv1.PodResources{
		{Name: "a", Namespace: "ns", Containers: []*podresourcesv1.ContainerResources{ctr("main", devs("nvidia.com/gpu", "g::2", "g::1"))}},
		{Name: "b", Namespace: "ns", Containers: []*podresourcesv1.ContainerResources{ctr("main", devs("nvidia.com/gpu", "g::2"))}},
	}})
	f.Add(seed, "g::1,g::2")
	f.Add(seed, "g::2")
	f.Add([]byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f}, "")
	f.Fuzz(func(t *testing.T, data []byte, ids string) {
		var resp podresourcesv1.ListPodResourcesResponse
		if err := proto.Unmarshal(data, &resp); err != nil {
			return
		}
		want := strings.Split(ids, ",")
		o, err := owner(&resp, "nvidia.com/gpu", want)
		if err != nil {
			return
		}
		held := 0
		for _, p := range resp.GetPodResources() {
			if p.GetNamespace() != o.Namespace || p.GetName() != o.Pod {
				continue
			}
			for _, c := range p.GetContainers() {
				if c.GetName() != o.Container {
					continue
				}
				var got []string
				for _, d := range c.GetDevices() {
					if d.GetResourceName() == "nvidia.com/gpu" {
						got = append(got, d.GetDeviceIds()...)
					}
				}
				slices.Sort(got)
				if slices.Equal(got, slices.Sorted(slices.Values(want))) {
					held++
				}
			}
		}
		if held == 0 {
			t.Fatalf("owner %s does not hold %v", o, want)
		}
	})
}
