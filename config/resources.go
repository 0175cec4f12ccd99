package config

import (
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/dynamig/dynamig/api"
)

// ResourceNames are the extended resources a GPU request is made of. Both the device config's
// nvidia section and the plugin args carry them, under the same keys.
type ResourceNames struct {
	ResourceCountName            string `json:"resourceCountName,omitempty"`
	ResourceMemoryName           string `json:"resourceMemoryName,omitempty"`
	ResourceMemoryPercentageName string `json:"resourceMemoryPercentageName,omitempty"`
	ResourceCoreName             string `json:"resourceCoreName,omitempty"`
}

// DefaultResourceNames are HAMi's names.
func DefaultResourceNames() ResourceNames {
	return ResourceNames{
		ResourceCountName:            api.ResourceCount,
		ResourceMemoryName:           api.ResourceMemory,
		ResourceMemoryPercentageName: api.ResourceMemoryPercentage,
		ResourceCoreName:             api.ResourceCores,
	}
}

// setDefaults fills the names left empty.
func (r *ResourceNames) setDefaults() {
	def := DefaultResourceNames()
	for _, f := range []struct {
		value *string
		def   string
	}{
		{&r.ResourceCountName, def.ResourceCountName},
		{&r.ResourceMemoryName, def.ResourceMemoryName},
		{&r.ResourceMemoryPercentageName, def.ResourceMemoryPercentageName},
		{&r.ResourceCoreName, def.ResourceCoreName},
	} {
		if *f.value == "" {
			*f.value = f.def
		}
	}
}

// validate checks each name and that no two are the same; path is the names' parent.
func (r *ResourceNames) validate(path *field.Path) field.ErrorList {
	var errs field.ErrorList
	seen := map[string]string{}
	for _, rn := range []struct{ key, value string }{
		{"resourceCountName", r.ResourceCountName},
		{"resourceMemoryName", r.ResourceMemoryName},
		{"resourceMemoryPercentageName", r.ResourceMemoryPercentageName},
		{"resourceCoreName", r.ResourceCoreName},
	} {
		p := path.Child(rn.key)
		errs = append(errs, ValidateResourceName(p, rn.value)...)
		if other, dup := seen[rn.value]; dup && rn.value != "" {
			errs = append(errs, field.Invalid(p, rn.value, "is also "+other))
		}
		seen[rn.value] = rn.key
	}
	return errs
}

// ValidateResourceName checks an extended resource name such as nvidia.com/gpu.
func ValidateResourceName(path *field.Path, name string) field.ErrorList {
	if name == "" {
		return field.ErrorList{field.Required(path, "an extended resource name such as nvidia.com/gpu")}
	}
	if !strings.Contains(name, "/") {
		return field.ErrorList{field.Invalid(path, name, "must be a domain-qualified name such as nvidia.com/gpu")}
	}
	var errs field.ErrorList
	for _, msg := range validation.IsQualifiedName(name) {
		errs = append(errs, field.Invalid(path, name, msg))
	}
	return errs
}
