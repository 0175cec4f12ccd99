package config

import (
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// decodeYAML decodes YAML into out (a pointer to a struct) field by field, matching keys to
// `json` tags. Unlike yaml.KnownFields, every error names the field path
// (nvidia.migProfileAllowlist[1].profiles[0]) rather than a line, and all errors are
// reported at once. Fields absent from the document keep the value out already has, which is
// how defaults are applied.
func decodeYAML(data []byte, out any) field.ErrorList {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return field.ErrorList{field.Invalid(nil, "", fmt.Sprintf("not valid YAML: %v", err))}
	}
	if len(doc.Content) == 0 { // empty document: all defaults
		return nil
	}
	d := &yamlDecoder{}
	return d.decodeNode(doc.Content[0], nil, reflect.ValueOf(out).Elem())
}

// maxAliases bounds alias expansion, so a document of nested aliases (a "billion laughs")
// cannot make decoding exponential.
const maxAliases = 1000

type yamlDecoder struct{ aliases int }

func (d *yamlDecoder) decodeNode(n *yaml.Node, path *field.Path, v reflect.Value) field.ErrorList {
	if n.Kind == yaml.AliasNode {
		if d.aliases++; d.aliases > maxAliases {
			return field.ErrorList{field.Invalid(path, "*"+n.Value, fmt.Sprintf("more than %d alias expansions", maxAliases))}
		}
		n = n.Alias
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil // "key:" with no value keeps the default
	}
	if v.CanAddr() {
		if u, ok := v.Addr().Interface().(json.Unmarshaler); ok {
			return decodeViaJSON(n, path, u)
		}
	}
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		return d.decodeNode(n, path, v.Elem())
	case reflect.Struct:
		return d.decodeStruct(n, path, v)
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			return field.ErrorList{field.Invalid(path, nodeValue(n), "must be a list")}
		}
		s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
		var errs field.ErrorList
		for i, item := range n.Content {
			errs = append(errs, d.decodeNode(item, path.Index(i), s.Index(i))...)
		}
		v.Set(s)
		return errs
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			return field.ErrorList{field.Invalid(path, nodeValue(n), "must be a mapping")}
		}
		m := reflect.MakeMap(v.Type())
		var errs field.ErrorList
		for i := 0; i+1 < len(n.Content); i += 2 {
			key := n.Content[i].Value
			elem := reflect.New(v.Type().Elem()).Elem()
			errs = append(errs, d.decodeNode(n.Content[i+1], path.Key(key), elem)...)
			m.SetMapIndex(reflect.ValueOf(key).Convert(v.Type().Key()), elem)
		}
		v.Set(m)
		return errs
	case reflect.Interface: // accepted but not interpreted (other vendors' sections)
		var anything any
		if err := n.Decode(&anything); err != nil {
			return field.ErrorList{field.Invalid(path, nodeValue(n), err.Error())}
		}
		if anything != nil {
			v.Set(reflect.ValueOf(anything))
		}
		return nil
	default:
		return decodeScalar(n, path, v)
	}
}

// decodeViaJSON serves types with their own JSON form, such as metav1.Duration ("2m").
func decodeViaJSON(n *yaml.Node, path *field.Path, u json.Unmarshaler) field.ErrorList {
	var anything any
	if err := n.Decode(&anything); err != nil {
		return field.ErrorList{field.Invalid(path, nodeValue(n), err.Error())}
	}
	raw, err := json.Marshal(anything)
	if err == nil {
		err = u.UnmarshalJSON(raw)
	}
	if err != nil {
		return field.ErrorList{field.Invalid(path, nodeValue(n), err.Error())}
	}
	return nil
}

func (d *yamlDecoder) decodeStruct(n *yaml.Node, path *field.Path, v reflect.Value) field.ErrorList {
	if n.Kind != yaml.MappingNode {
		return field.ErrorList{field.Invalid(path, nodeValue(n), "must be a mapping")}
	}
	fields := jsonFields(v.Type())
	var errs field.ErrorList
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		key, val := n.Content[i].Value, n.Content[i+1]
		p := path.Child(key)
		if seen[key] {
			errs = append(errs, field.Duplicate(p, key))
			continue
		}
		seen[key] = true
		idx, ok := fields[key]
		if !ok {
			if refusal, known := refusedFields[key]; known {
				errs = append(errs, field.Forbidden(p, refusal))
				continue
			}
			errs = append(errs, field.Invalid(p, key, "unknown field; known fields here: "+strings.Join(sortedKeys(fields), ", ")))
			continue
		}
		errs = append(errs, d.decodeNode(val, p, v.FieldByIndex(idx))...)
	}
	return errs
}

// refusedFields are keys that an older HAMi accepted and this version refuses, with what to do.
var refusedFields = map[string]string{
	"knownMigGeometries": "knownMigGeometries (HAMi v2.9 fixed MIG templates) is no longer supported: replace it with migProfileAllowlist, a list of {models, profiles} naming the MIG profiles each GPU model may be split into",
}

func decodeScalar(n *yaml.Node, path *field.Path, v reflect.Value) field.ErrorList {
	if n.Kind != yaml.ScalarNode {
		return field.ErrorList{field.Invalid(path, nodeValue(n), "must be a "+kindWord(v.Kind()))}
	}
	bad := func() field.ErrorList {
		return field.ErrorList{field.Invalid(path, n.Value, "must be a "+kindWord(v.Kind()))}
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(n.Value)
	case reflect.Bool:
		if !isBoolWord(n.Value) {
			return bad()
		}
		v.SetBool(strings.EqualFold(n.Value, "true"))
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		i, err := strconv.ParseInt(n.Value, 0, v.Type().Bits())
		if err != nil {
			return bad()
		}
		v.SetInt(i)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		u, err := strconv.ParseUint(n.Value, 0, v.Type().Bits())
		if err != nil {
			return bad()
		}
		v.SetUint(u)
	case reflect.Float32, reflect.Float64:
		f, err := strconv.ParseFloat(n.Value, v.Type().Bits())
		if err != nil {
			return bad()
		}
		v.SetFloat(f)
	default:
		return field.ErrorList{field.InternalError(path, fmt.Errorf("cannot decode into %s", v.Type()))}
	}
	return nil
}

func isBoolWord(s string) bool {
	switch strings.ToLower(s) {
	case "true", "false":
		return true
	}
	return false
}

func kindWord(k reflect.Kind) string {
	switch k {
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "boolean (true or false)"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "whole number"
	case reflect.Float32, reflect.Float64:
		return "number"
	default:
		return k.String()
	}
}

// nodeValue renders a node for an error message, shortened.
func nodeValue(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "<mapping>"
	case yaml.SequenceNode:
		return "<list>"
	}
	if len(n.Value) > 60 {
		return n.Value[:60] + "…"
	}
	return n.Value
}

// jsonFields maps a struct's json names to field indexes, descending into inlined structs.
func jsonFields(t reflect.Type) map[string][]int {
	out := map[string][]int{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		name, opts, _ := strings.Cut(tag, ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if strings.Contains(opts, "inline") || (f.Anonymous && name == "") {
			for k, idx := range jsonFields(f.Type) {
				out[k] = append([]int{i}, idx...)
			}
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = []int{i}
	}
	return out
}

func sortedKeys(m map[string][]int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
