package allocate

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/dynamig/dynamig/api"
)

// HAMiCoreOptions say where HAMi-core's library lives on the host and how memory is scaled.
type HAMiCoreOptions struct {
	// HostDir holds libvgpu.so and ld.so.preload (HAMi's default /usr/local/vgpu).
	HostDir string
	// MemoryScaling above 1 lets shares oversubscribe memory (CUDA_OVERSUBSCRIBE).
	MemoryScaling float64
}

// hamiCoreContainerDir is where the library is mounted in the container, as HAMi does.
const hamiCoreContainerDir = "/usr/local/vgpu"

// allocateHAMiCore hands the holder's next GPU container its hami-core shares: the GPUs in
// NVIDIA_VISIBLE_DEVICES and HAMi-core's limits in the environment, consuming that
// container's segment of hami.io/vgpu-devices-to-allocate as HAMi's device plugin does.
func (a *Allocator) allocateHAMiCore(ctx context.Context, lease *coordinationv1.Lease, pod *v1.Pod, req *pluginapi.ContainerAllocateRequest) (*pluginapi.ContainerAllocateResponse, error) {
	pending, err := api.DecodeHAMiCoreDevices(api.DevicesToAllocateAnnotation, pod.Annotations[api.DevicesToAllocateAnnotation])
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	gpuContainers := a.gpuContainers(pod)
	next, last := -1, false
	for k, c := range gpuContainers {
		if c < len(pending) && len(pending[c]) > 0 {
			next, last = c, k == len(gpuContainers)-1
			break
		}
	}
	if next < 0 {
		return nil, fmt.Errorf("pod %s/%s: every GPU container already has its shares; this Allocate call belongs to no container of the hand-off holder", pod.Namespace, pod.Name)
	}
	devs := pending[next]
	if len(devs) != len(req.DevicesIds) {
		return nil, fmt.Errorf("pod %s/%s container %d has %d shares but kubelet asks for %d devices: refusing an Allocate that cannot be attributed", pod.Namespace, pod.Name, next, len(devs), len(req.DevicesIds))
	}
	resp := a.hamiCoreResponse(pod, next, devs)
	pending[next] = nil
	annotations := map[string]any{api.DevicesToAllocateAnnotation: api.EncodeHAMiCoreDevices(pending)}
	if last {
		annotations[api.BindPhaseAnnotation] = api.BindPhaseSuccess
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": pod.ResourceVersion, "annotations": annotations}})
	if _, err := a.opts.Client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return nil, fmt.Errorf("consuming the hami-core assignment of pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	if last {
		a.releaseLease(ctx, lease)
	}
	return resp, nil
}

// hamiCoreResponse is HAMi-core's contract with its library: per device its memory limit,
// one SM limit, a shared cache file, and the library preloaded through mounts.
func (a *Allocator) hamiCoreResponse(pod *v1.Pod, container int, devs []api.HAMiCoreDevice) *pluginapi.ContainerAllocateResponse {
	hostDir := a.opts.HAMiCore.HostDir
	if hostDir == "" {
		hostDir = hamiCoreContainerDir
	}
	uuids := make([]string, len(devs))
	env := map[string]string{}
	for i, d := range devs {
		uuids[i] = d.UUID
		env[fmt.Sprintf("CUDA_DEVICE_MEMORY_LIMIT_%d", i)] = fmt.Sprintf("%dm", d.MemoryMiB)
	}
	env["NVIDIA_VISIBLE_DEVICES"] = strings.Join(uuids, ",")
	env["CUDA_DEVICE_SM_LIMIT"] = fmt.Sprint(devs[0].Cores)
	cache := fmt.Sprintf("%s/%s_%d.cache", hamiCoreContainerDir, pod.UID, container)
	env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = cache
	if a.opts.HAMiCore.MemoryScaling > 1 {
		env["CUDA_OVERSUBSCRIBE"] = "true"
	}
	return &pluginapi.ContainerAllocateResponse{
		Envs: env,
		Mounts: []*pluginapi.Mount{
			{ContainerPath: filepath.Join(hamiCoreContainerDir, "libvgpu.so"), HostPath: filepath.Join(hostDir, "libvgpu.so"), ReadOnly: true},
			{ContainerPath: "/etc/ld.so.preload", HostPath: filepath.Join(hostDir, "ld.so.preload"), ReadOnly: true},
			{ContainerPath: filepath.Dir(cache), HostPath: filepath.Join(hostDir, "containers", string(pod.UID)), ReadOnly: false},
		},
	}
}
