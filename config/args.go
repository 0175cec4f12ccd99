package config

import (
	"fmt"
	"net"
	"slices"

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
}

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
