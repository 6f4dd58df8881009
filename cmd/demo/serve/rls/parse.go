package rls

import (
	"bytes"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	_ "github.com/holdfast/holdfast/algorithms" // registers the built-in algorithms
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/fallback"
)

// MaxSize is the largest config file Load accepts, in bytes.
const MaxSize = 1 << 20

// MaxDepth is the deepest descriptor nesting a config may have.
const MaxDepth = MaxEntries

// DefaultAlgorithm is the algorithm of a rate_limit that names none (see
// the package comment for why).
const DefaultAlgorithm = "token_bucket"

// A FieldError reports a bad value in a config file: the file, the domain,
// the field's path from the top (descriptors[0].rate_limit.unit) and what
// is wrong. Err, when set, is the cause (core.ErrInvalidPolicy for numbers
// a policy cannot have).
type FieldError struct {
	File   string
	Domain string
	Field  string
	Msg    string
	Err    error
}

// Error returns e.g. `rls: messaging.yaml: domain "messaging":
// descriptors[1].rate_limit.unit: want second, minute, hour, day, week,
// month or year, got "fortnight"`.
func (e *FieldError) Error() string {
	var b strings.Builder
	b.WriteString("rls: ")
	if e.File != "" {
		b.WriteString(e.File)
		b.WriteString(": ")
	}
	if e.Domain != "" {
		fmt.Fprintf(&b, "domain %s: ", show(e.Domain))
	}
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Unwrap returns the cause.
func (e *FieldError) Unwrap() error { return e.Err }

// LoadPath loads a config file, or every *.yaml and *.yml file of a
// directory (each a domain, as envoyproxy/ratelimit's config directory).
// A domain given twice is an error naming both files.
func LoadPath(path string) (*Config, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("rls: %w", err)
	}
	files := []string{path}
	if fi.IsDir() {
		files = nil
		ents, err := os.ReadDir(path)
		if err != nil {
			return nil, fmt.Errorf("rls: %w", err)
		}
		for _, e := range ents {
			if ext := filepath.Ext(e.Name()); !e.IsDir() && (ext == ".yaml" || ext == ".yml") {
				files = append(files, filepath.Join(path, e.Name()))
			}
		}
		if len(files) == 0 {
			return nil, fmt.Errorf("rls: %s: no .yaml or .yml files", path)
		}
	}
	c := &Config{domains: map[string]*Domain{}}
	for _, f := range files {
		src, err := readFile(f)
		if err != nil {
			return nil, err
		}
		if err := c.add(src, f); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func readFile(name string) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("rls: %w", err)
	}
	defer f.Close()
	src, err := io.ReadAll(io.LimitReader(f, MaxSize+1))
	if err != nil {
		return nil, fmt.Errorf("rls: %s: %w", name, err)
	}
	return src, nil
}

// Load loads one domain's config from src; file names it in errors.
func Load(src []byte, file string) (*Config, error) {
	c := &Config{domains: map[string]*Domain{}}
	if err := c.add(src, file); err != nil {
		return nil, err
	}
	return c, nil
}

// add parses one file's domain into c.
func (c *Config) add(src []byte, file string) error {
	if len(src) > MaxSize {
		return &FieldError{File: file, Msg: fmt.Sprintf("larger than %d bytes", MaxSize)}
	}
	root, err := decode(src, file)
	if err != nil {
		return err
	}
	p := &parser{file: file, names: map[string]string{}}
	for _, l := range c.limits {
		p.names[l.Policy.Name()] = l.Domain
	}
	d, err := p.domain(root)
	if err != nil {
		return err
	}
	if prev := c.domains[d.Name]; prev != nil {
		return &FieldError{File: file, Domain: d.Name, Field: "domain", Msg: fmt.Sprintf("already loaded from %s", prev.File)}
	}
	c.domains[d.Name] = d
	c.limits = append(c.limits, p.limits...)
	return nil
}

// decode parses exactly one YAML document into its top node.
func decode(src []byte, file string) (n *yaml.Node, err error) {
	defer func() {
		// The YAML library reads outside input: a panic in it must not
		// take the service down.
		if r := recover(); r != nil {
			n, err = nil, &FieldError{File: file, Msg: fmt.Sprintf("malformed YAML: %v", r)}
		}
	}()
	dec := yaml.NewDecoder(bytes.NewReader(src))
	var root yaml.Node
	if err := dec.Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, &FieldError{File: file, Field: "domain", Msg: "empty config, want a domain and its descriptors"}
		}
		return nil, &FieldError{File: file, Msg: strings.TrimPrefix(err.Error(), "yaml: ")}
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, &FieldError{File: file, Msg: "more than one YAML document (a second '---'): give each domain its own file"}
	}
	n = &root
	if n.Kind == yaml.DocumentNode && len(n.Content) == 1 {
		n = deref(n.Content[0])
	}
	if n == nil || isNull(n) {
		return nil, &FieldError{File: file, Field: "domain", Msg: "empty config, want a domain and its descriptors"}
	}
	if n.Kind != yaml.MappingNode {
		return nil, &FieldError{File: file, Msg: "want a mapping of domain and descriptors at the top level"}
	}
	return n, nil
}

// parser is one file's parse.
type parser struct {
	file, domainName string
	algorithm        string              // the file's default algorithm
	outage           fallback.OutageMode // the file's default outage mode
	limits           []*Limit
	names            map[string]string // policy names taken, with their domain
}

func (p *parser) errorf(field string, cause error, format string, args ...any) error {
	return &FieldError{File: p.file, Domain: p.domainName, Field: field, Msg: fmt.Sprintf(format, args...), Err: cause}
}

// fields reads mapping n's fields, refusing names not in allowed (listed
// in the message as want) and repeated ones. at is n's path.
func (p *parser) fields(n *yaml.Node, at string, allowed []string) (map[string]*yaml.Node, error) {
	m := map[string]*yaml.Node{}
	for j := 0; j+1 < len(n.Content); j += 2 {
		k, v := deref(n.Content[j]), deref(n.Content[j+1])
		if k == nil || v == nil || k.Kind != yaml.ScalarNode {
			return nil, p.errorf(at, nil, "field names must be plain strings")
		}
		if !slices.Contains(allowed, k.Value) {
			return nil, p.errorf(join(at, k.Value), nil, "unknown field (want %s)", orList(allowed))
		}
		if m[k.Value] != nil {
			return nil, p.errorf(join(at, k.Value), nil, "given twice")
		}
		m[k.Value] = v
	}
	return m, nil
}

var (
	topFields        = []string{"domain", "descriptors", "algorithm", "outage"}
	descriptorFields = []string{"key", "value", "rate_limit", "descriptors", "shadow_mode", "quota_mode", "detailed_metric", "value_to_metric", "share_threshold", "metadata"}
	rateLimitFields  = []string{"unit", "requests_per_unit", "unlimited", "name", "replaces", "algorithm", "outage"}
)

func (p *parser) domain(n *yaml.Node) (*Domain, error) {
	f, err := p.fields(n, "", topFields)
	if err != nil {
		return nil, err
	}
	name, err := p.str(f, "", "domain", true)
	if err != nil {
		return nil, err
	}
	if len(name) > MaxDomainLen {
		return nil, p.errorf("domain", nil, "longer than %d bytes", MaxDomainLen)
	}
	p.domainName = name
	if p.algorithm, err = p.algorithmOf(f, "", DefaultAlgorithm); err != nil {
		return nil, err
	}
	if p.outage, err = p.outageOf(f, "", fallback.Leases); err != nil {
		return nil, err
	}
	d := &Domain{Name: name, File: p.file}
	if err := p.level(&d.root, f["descriptors"], "descriptors", nil, nil); err != nil {
		return nil, err
	}
	return d, nil
}

// level reads a descriptors list into lv; keys and tokens are the path of
// the list's parent (keys for the metrics label, tokens for the policy
// name).
func (p *parser) level(lv *level, n *yaml.Node, at string, keys, tokens []string) error {
	if n == nil || isNull(n) {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		return p.errorf(at, nil, "want a list of descriptors")
	}
	if len(keys) >= MaxDepth {
		return p.errorf(at, nil, "nested deeper than %d levels, more entries than a request may carry", MaxDepth)
	}
	lv.exact, lv.byKey = map[Entry]*node{}, map[string]*node{}
	for i, dn := range n.Content {
		here := fmt.Sprintf("%s[%d]", at, i)
		dn = deref(dn)
		if dn == nil || dn.Kind != yaml.MappingNode {
			return p.errorf(here, nil, "want a mapping of key, value, rate_limit, descriptors, ...")
		}
		nd, err := p.descriptor(dn, here, keys, tokens)
		if err != nil {
			return err
		}
		e := Entry{nd.key, nd.value}
		_, dup := lv.exact[e]
		if nd.value == "" {
			_, dup = lv.byKey[nd.key]
		}
		if dup {
			return p.errorf(here, nil, "key %s with value %s is given twice in this list", show(nd.key), show(nd.value))
		}
		switch {
		case nd.value == "":
			lv.byKey[nd.key] = nd
		case nd.parts != nil:
			lv.exact[e] = nd // a request value equal to the pattern matches it too
			lv.wildcard = append(lv.wildcard, nd)
		default:
			lv.exact[e] = nd
		}
	}
	return nil
}

func (p *parser) descriptor(n *yaml.Node, at string, keys, tokens []string) (*node, error) {
	f, err := p.fields(n, at, descriptorFields)
	if err != nil {
		return nil, err
	}
	nd := &node{}
	if nd.key, err = p.str(f, at, "key", true); err != nil {
		return nil, err
	}
	if nd.value, err = p.str(f, at, "value", false); err != nil {
		return nil, err
	}
	if len(nd.key) > MaxEntryLen || len(nd.value) > MaxEntryLen {
		return nil, p.errorf(join(at, "key"), nil, "key or value longer than %d bytes", MaxEntryLen)
	}
	if strings.Contains(nd.value, "*") {
		nd.parts = strings.Split(nd.value, "*")
	}
	flags := map[string]bool{}
	for _, b := range []string{"shadow_mode", "quota_mode", "detailed_metric", "value_to_metric", "share_threshold"} {
		if flags[b], err = p.boolean(f, at, b); err != nil {
			return nil, err
		}
	}
	if flags["quota_mode"] {
		return nil, p.errorf(join(at, "quota_mode"), nil, "not supported by holdfast (a quota descriptor's denial does not deny the request); remove it or set it false")
	}
	nd.share = flags["share_threshold"]
	if nd.share && nd.parts == nil {
		return nil, p.errorf(join(at, "share_threshold"), nil, "only for a wildcard value (one with '*'), got value %s", show(nd.value))
	}
	if m := f["metadata"]; m != nil && !isNull(m) && m.Kind != yaml.MappingNode {
		return nil, p.errorf(join(at, "metadata"), nil, "want a mapping")
	}
	keys = append(keys[:len(keys):len(keys)], nd.key)
	tok := nd.key
	if nd.value != "" {
		tok += "_" + nd.value
	}
	tokens = append(tokens[:len(tokens):len(tokens)], tok)
	if rl := f["rate_limit"]; rl != nil && !isNull(rl) {
		if nd.limit, err = p.rateLimit(rl, join(at, "rate_limit"), keys, tokens); err != nil {
			return nil, err
		}
		nd.limit.ShadowMode = flags["shadow_mode"]
	}
	if err := p.level(&nd.children, f["descriptors"], join(at, "descriptors"), keys, tokens); err != nil {
		return nil, err
	}
	return nd, nil
}

func (p *parser) rateLimit(n *yaml.Node, at string, keys, tokens []string) (*Limit, error) {
	if n.Kind != yaml.MappingNode {
		return nil, p.errorf(at, nil, "want a mapping of unit and requests_per_unit (or unlimited: true)")
	}
	f, err := p.fields(n, at, rateLimitFields)
	if err != nil {
		return nil, err
	}
	l := &Limit{Domain: p.domainName, KeyPath: strings.Join(keys, ".")}
	if l.Name, err = p.str(f, at, "name", false); err != nil {
		return nil, err
	}
	if l.Replaces, err = p.replaces(f, at, l.Name); err != nil {
		return nil, err
	}
	if l.Unlimited, err = p.boolean(f, at, "unlimited"); err != nil {
		return nil, err
	}
	unit, err := p.str(f, at, "unit", false)
	if err != nil {
		return nil, err
	}
	if l.Unlimited {
		for _, field := range []string{"unit", "requests_per_unit", "algorithm", "outage"} {
			if v := f[field]; v != nil && !isNull(v) {
				return nil, p.errorf(join(at, field), nil, "not with unlimited: true")
			}
		}
		return l, nil
	}
	var ok bool
	if l.Unit, ok = unitNames[strings.ToLower(unit)]; !ok {
		return nil, p.errorf(join(at, "unit"), nil, "want second, minute, hour, day, week, month or year, got %s", show(unit))
	}
	rpu := f["requests_per_unit"]
	if rpu == nil || isNull(rpu) {
		return nil, p.errorf(join(at, "requests_per_unit"), nil, "required (0 denies every request)")
	}
	var v int64
	if rpu.Kind != yaml.ScalarNode || rpu.ShortTag() != "!!int" || rpu.Decode(&v) != nil || v < 0 || v > math.MaxUint32 {
		return nil, p.errorf(join(at, "requests_per_unit"), nil, "want an integer from 0 to %d, got %s", uint32(math.MaxUint32), show(rpu.Value))
	}
	l.RequestsPerUnit = uint32(v)
	algName, err := p.algorithmOf(f, at, p.algorithm)
	if err != nil {
		return nil, err
	}
	alg, err := driver.AlgorithmByName(algName)
	if err != nil {
		return nil, p.errorf(join(at, "algorithm"), err, "%v", err)
	}
	if l.Outage, err = p.outageOf(f, at, p.outage); err != nil {
		return nil, err
	}
	if l.RequestsPerUnit == 0 {
		return l, nil
	}
	name, err := p.policyName(tokens)
	if err != nil {
		return nil, p.errorf(at, err, "%v", err)
	}
	if l.Policy, err = newPolicy(alg, name, int64(l.RequestsPerUnit), l.Unit.Duration()); err != nil {
		return nil, p.errorf(join(at, "requests_per_unit"), err, "%d per %s with %s: %s", l.RequestsPerUnit, l.Unit, alg.Name(),
			strings.TrimPrefix(strings.ReplaceAll(err.Error(), fmt.Sprintf("policy %q: ", name), ""), core.ErrInvalidPolicy.Error()+": "))
	}
	p.limits = append(p.limits, l)
	return l, nil
}

// newPolicy is limit per window as alg's policy: a rate algorithm's bucket
// of capacity limit refilled at limit per window, or a window algorithm's
// limit per window.
func newPolicy(alg driver.Algorithm, name string, limit int64, window time.Duration) (core.Policy, error) {
	switch a := alg.(type) {
	case driver.RateAlgorithm:
		return a.RatePolicy(name, limit, float64(limit)/window.Seconds())
	case driver.WindowAlgorithm:
		return a.WindowPolicy(name, limit, window)
	}
	return core.Policy{}, driver.Errorf(core.ErrInvalidPolicy, "algorithm %s takes no rate or window", alg.Name())
}

func (p *parser) replaces(f map[string]*yaml.Node, at, own string) ([]string, error) {
	n := f["replaces"]
	if n == nil || isNull(n) {
		return nil, nil
	}
	at = join(at, "replaces")
	if n.Kind != yaml.SequenceNode {
		return nil, p.errorf(at, nil, "want a list of {name: ...}")
	}
	var names []string
	for i, e := range n.Content {
		here := fmt.Sprintf("%s[%d]", at, i)
		e = deref(e)
		if e == nil || e.Kind != yaml.MappingNode {
			return nil, p.errorf(here, nil, "want a mapping with name")
		}
		ef, err := p.fields(e, here, []string{"name"})
		if err != nil {
			return nil, err
		}
		name, err := p.str(ef, here, "name", true)
		if err != nil {
			return nil, err
		}
		if name == own {
			return nil, p.errorf(join(here, "name"), nil, "a limit cannot replace itself (%s)", show(name))
		}
		names = append(names, name)
	}
	return names, nil
}

// policyName is a policy name for the descriptor path tokens: the domain
// and tokens joined by '.', the bytes a policy name may not hold as '_';
// when that changed or cut anything, a hash of the whole path follows, so
// two descriptors never share a name (and a storage key).
func (p *parser) policyName(tokens []string) (string, error) {
	full := p.domainName + "." + strings.Join(tokens, ".")
	b := []byte(full)
	changed := false
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			b[i], changed = '_', true
		}
	}
	name := string(b)
	if changed || len(name) > driver.MaxPolicyName {
		h := fnv.New32a()
		h.Write([]byte(full))
		name = fmt.Sprintf("%.*s-%08x", driver.MaxPolicyName-9, name, h.Sum32())
	}
	if d, taken := p.names[name]; taken {
		return "", fmt.Errorf("policy name %s of this descriptor is taken by another of domain %s", show(name), show(d))
	}
	p.names[name] = p.domainName
	return name, nil
}

func (p *parser) algorithmOf(f map[string]*yaml.Node, at, def string) (string, error) {
	name, err := p.str(f, at, "algorithm", false)
	if err != nil || name == "" {
		return def, err
	}
	alg, err := driver.AlgorithmByName(name)
	if err == nil {
		switch alg.(type) {
		case driver.RateAlgorithm, driver.WindowAlgorithm:
			if _, ok := alg.(driver.Refunder); ok {
				return name, nil
			}
		}
	}
	return "", p.errorf(join(at, "algorithm"), core.ErrInvalidPolicy, "want token_bucket, sliding_window or sliding_window_counter, got %s", show(name))
}

func (p *parser) outageOf(f map[string]*yaml.Node, at string, def fallback.OutageMode) (fallback.OutageMode, error) {
	s, err := p.str(f, at, "outage", false)
	if err != nil || s == "" {
		return def, err
	}
	m, err := fallback.ParseOutageMode(s)
	if err != nil {
		return def, p.errorf(join(at, "outage"), nil, "want leases, fail_open or fail_closed, got %s", show(s))
	}
	return m, nil
}

// str reads a scalar field as a string (envoyproxy/ratelimit takes
// `value: 500` as "500").
func (p *parser) str(f map[string]*yaml.Node, at, field string, required bool) (string, error) {
	n := f[field]
	if n == nil || isNull(n) {
		if required {
			return "", p.errorf(join(at, field), nil, "required")
		}
		return "", nil
	}
	if n.Kind != yaml.ScalarNode {
		return "", p.errorf(join(at, field), nil, "want a single value, got a list or mapping")
	}
	if required && n.Value == "" {
		return "", p.errorf(join(at, field), nil, "required, got an empty string")
	}
	return n.Value, nil
}

func (p *parser) boolean(f map[string]*yaml.Node, at, field string) (bool, error) {
	n := f[field]
	if n == nil || isNull(n) {
		return false, nil
	}
	var v bool
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" || n.Decode(&v) != nil {
		return false, p.errorf(join(at, field), nil, "want true or false, got %s", show(n.Value))
	}
	return v, nil
}

func join(at, field string) string {
	if at == "" {
		return field
	}
	return at + "." + field
}

func orList(s []string) string {
	if len(s) == 1 {
		return s[0]
	}
	return strings.Join(s[:len(s)-1], ", ") + " or " + s[len(s)-1]
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" }

func deref(n *yaml.Node) *yaml.Node {
	if n != nil && n.Kind == yaml.AliasNode {
		return n.Alias
	}
	return n
}

// show quotes a value from the config for an error message, cut to 64
// bytes.
func show(s string) string {
	if len(s) > 64 {
		return fmt.Sprintf("%q...", s[:64])
	}
	return fmt.Sprintf("%q", s)
}
