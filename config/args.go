package config

import (
	"fmt"
	"net"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/dynamig/dynamig/api"
)

// DynamicMIGArgs are the DynamicMIG plugin's arguments in a KubeSchedulerConfiguration
// profile (pluginConfig[].args). Unset fields take the defaults of SetDefaults.
type DynamicMIGArgs struct {
	metav1.TypeMeta `json:",inline"`

	// DeviceConfigFile is the device-config.yaml (HAMi's device ConfigMap, mounted) with
	// the MIG allowlist and the request defaults; empty means HAMi v2.10's defaults.
	DeviceConfigFile string `json:"deviceConfigFile,omitempty"`

	// ResourceNames must agree with the device config's.
	ResourceNames `json:",inline"`

	// NodeSchedulerPolicy orders nodes: binpack (default) or spread.
	NodeSchedulerPolicy string `json:"nodeSchedulerPolicy,omitempty"`
	// MIGGPUSchedulerPolicy orders MIG GPUs within a node: binpack (default; MIG isolation
	// makes spreading useless, and spread small instances leave no GPU free for large
	// profiles) or spread.
	MIGGPUSchedulerPolicy string `json:"migGPUSchedulerPolicy,omitempty"`
	// HAMiCoreGPUSchedulerPolicy orders hami-core GPUs: spread (default, as HAMi) or binpack.
	HAMiCoreGPUSchedulerPolicy string `json:"hamiCoreGPUSchedulerPolicy,omitempty"`
	// FragmentationAware adds the fragmentation cost of a placement to its score (default
	// true); false is the ablation the benchmarks compare against.
	FragmentationAware *bool `json:"fragmentationAware,omitempty"`

	// LeaseNamespace holds the device plugins' heartbeat Leases and the ConfigMap of the
	// reservation signing public keys.
	LeaseNamespace string `json:"leaseNamespace,omitempty"`
	// SigningKeyNamespace holds the Secret of the scheduler's reservation signing key; only
	// the scheduler may read Secrets there (default dynamig-signing).
	SigningKeyNamespace string `json:"signingKeyNamespace,omitempty"`
	// CreateSigningKey lets the scheduler create its reservation signing key on first start
	// when the Secret does not exist (default true). false: an operator provides the key.
	CreateSigningKey *bool `json:"createSigningKey,omitempty"`

	// MetricsBindAddress is where cmd/dynamig-scheduler serves the plugin's metrics.
	MetricsBindAddress string `json:"metricsBindAddress,omitempty"`
	// LegacyMetrics also exports HAMi's scheduler series under their legacy names
	// (nodeGPUMigInstance, GPUDeviceMemoryLimit, vGPUMemoryAllocated, …).
	LegacyMetrics bool `json:"legacyMetrics,omitempty"`

	// Relocation lets DynamicMIG evict pods that allow it to make room for a pending MIG pod
	// (docs/configuration.md, relocation); off unless enabled.
	Relocation RelocationArgs `json:"relocation,omitempty"`
}

// RelocationArgs configure relocation: when a pending MIG pod fits on a GPU only if pods
// annotated dynamig.io/relocatable move, and each of them fits elsewhere now, DynamicMIG's
// PostFilter evicts them (Eviction API) and nominates the pod to the freed placement.
type RelocationArgs struct {
	// Enabled turns relocation on (default false).
	Enabled bool `json:"enabled,omitempty"`
	// Interval: pods of a controller whose pods were relocated are not relocated again within
	// it (default 10m).
	Interval *metav1.Duration `json:"interval,omitempty"`
	// MaxPods is the most pods moved for one pending pod, from one GPU (default 3, at most 7).
	MaxPods int `json:"maxPods,omitempty"`
}

// Relocation's defaults and bounds.
const (
	DefaultRelocationInterval = 10 * time.Minute
	DefaultRelocationMaxPods  = 3
	// MaxRelocationMaxPods: a MIG GPU holds at most 7 instances.
	MaxRelocationMaxPods = 7
)

// DefaultSchedulerMetricsAddress is the default MetricsBindAddress.
const DefaultSchedulerMetricsAddress = ":9395"

var _ runtime.Object = &DynamicMIGArgs{}

// DeepCopyObject implements runtime.Object.
func (a *DynamicMIGArgs) DeepCopyObject() runtime.Object {
	out := *a
	if a.FragmentationAware != nil {
		v := *a.FragmentationAware
		out.FragmentationAware = &v
	}
	if a.CreateSigningKey != nil {
		v := *a.CreateSigningKey
		out.CreateSigningKey = &v
	}
	if a.Relocation.Interval != nil {
		v := *a.Relocation.Interval
		out.Relocation.Interval = &v
	}
	return &out
}

// SetDefaults fills every unset field.
func (a *DynamicMIGArgs) SetDefaults() {
	setDefault := func(field *string, value string) {
		if *field == "" {
			*field = value
		}
	}
	a.ResourceNames.setDefaults()
	setDefault(&a.NodeSchedulerPolicy, api.PolicyBinpack)
	setDefault(&a.MIGGPUSchedulerPolicy, api.PolicyBinpack)
	setDefault(&a.HAMiCoreGPUSchedulerPolicy, api.PolicySpread)
	setDefault(&a.LeaseNamespace, api.DefaultSystemNamespace)
	setDefault(&a.SigningKeyNamespace, api.DefaultSigningKeyNamespace)
	setDefault(&a.MetricsBindAddress, DefaultSchedulerMetricsAddress)
	if a.FragmentationAware == nil {
		a.FragmentationAware = ptrTo(true)
	}
	if a.CreateSigningKey == nil {
		a.CreateSigningKey = ptrTo(true)
	}
	if a.Relocation.Interval == nil {
		a.Relocation.Interval = &metav1.Duration{Duration: DefaultRelocationInterval}
	}
	if a.Relocation.MaxPods == 0 {
		a.Relocation.MaxPods = DefaultRelocationMaxPods
	}
}

// Validate checks defaulted args; paths are relative to the plugin's args.
func (a *DynamicMIGArgs) Validate() field.ErrorList {
	errs := a.ResourceNames.validate(nil)
	policies := []string{api.PolicyBinpack, api.PolicySpread}
	for _, p := range []struct{ key, value string }{
		{"nodeSchedulerPolicy", a.NodeSchedulerPolicy},
		{"migGPUSchedulerPolicy", a.MIGGPUSchedulerPolicy},
		{"hamiCoreGPUSchedulerPolicy", a.HAMiCoreGPUSchedulerPolicy},
	} {
		if !slices.Contains(policies, p.value) {
			errs = append(errs, field.NotSupported(field.NewPath(p.key), p.value, policies))
		}
	}
	for _, msg := range validation.IsDNS1123Label(a.LeaseNamespace) {
		errs = append(errs, field.Invalid(field.NewPath("leaseNamespace"), a.LeaseNamespace, msg))
	}
	for _, msg := range validation.IsDNS1123Label(a.SigningKeyNamespace) {
		errs = append(errs, field.Invalid(field.NewPath("signingKeyNamespace"), a.SigningKeyNamespace, msg))
	}
	if a.MetricsBindAddress != "" {
		if _, _, err := net.SplitHostPort(a.MetricsBindAddress); err != nil {
			errs = append(errs, field.Invalid(field.NewPath("metricsBindAddress"), a.MetricsBindAddress, fmt.Sprintf("must be host:port or :port (%v)", err)))
		}
	}
	if d := a.Relocation.Interval; d != nil && d.Duration < 0 {
		errs = append(errs, field.Invalid(field.NewPath("relocation", "interval"), d.Duration.String(), "must not be negative"))
	}
	if n := a.Relocation.MaxPods; n < 1 || n > MaxRelocationMaxPods {
		errs = append(errs, field.Invalid(field.NewPath("relocation", "maxPods"), n, fmt.Sprintf("must be 1 to %d (a MIG GPU holds at most %d instances)", MaxRelocationMaxPods, MaxRelocationMaxPods)))
	}
	return errs
}

// DecodeDynamicMIGArgs decodes args given as YAML or JSON (the raw pluginConfig args),
// refusing unknown fields, and returns them defaulted and validated.
func DecodeDynamicMIGArgs(data []byte) (*DynamicMIGArgs, error) {
	args := &DynamicMIGArgs{}
	errs := decodeYAML(data, args)
	if len(errs) == 0 {
		args.SetDefaults()
		errs = args.Validate()
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("invalid DynamicMIG args: %w", errs.ToAggregate())
	}
	return args, nil
}

func ptrTo[T any](v T) *T { return &v }
