package mail

import (
	"bytes"
	"cmp"
	"embed"
	"errors"
	"fmt"
	htmltemplate "html/template"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	texttemplate "text/template"
	"text/template/parse"
	"time"

	"golang.org/x/text/language"
)

// Defaults of RendererConfig, the defaults of APP_NAME and DEFAULT_LOCALE too.
const (
	DefaultAppName = "postguard"
	DefaultLocale  = "en"
)

const (
	// DefaultVerificationExpiry is the verification link's life in the sample mail the
	// templates are checked with (the jobs' VerifyTokenTTL).
	DefaultVerificationExpiry = 24 * time.Hour

	// DefaultPasswordResetExpiry is the reset link's life in the sample mail the templates are
	// checked with (the jobs' ResetTokenTTL).
	DefaultPasswordResetExpiry = time.Hour
)

// Kind is a mail kind, the name of its templates (welcome.html, welcome.txt, …).
type Kind string

// The mail kinds.
const (
	KindWelcome       Kind = "welcome"
	KindVerification  Kind = "verification"
	KindPasswordReset Kind = "password_reset"
)

// Kinds returns every mail kind, in the order a preview lists them.
func Kinds() []Kind {
	return []Kind{KindWelcome, KindVerification, KindPasswordReset}
}

// layoutName is the name of the templates every kind is rendered inside.
const layoutName = "layout"

// Data is what one mail says besides the brand (RendererConfig's AppName and AppURL).
type Data struct {
	// Name is the user's name; "" when they gave none (the built-in templates then greet
	// "there").
	Name string

	// ActionURL is the target of the mail's button: the app (welcome), the verification or
	// the reset link. Required.
	ActionURL string

	// ExpiresIn is the life of the mail's link, 0 for a mail without one (welcome).
	ExpiresIn time.Duration

	// UnsubscribeURL is the one-click unsubscribe link (welcome, where it is required; the
	// caller sends it in the List-Unsubscribe header too).
	UnsubscribeURL string
}

// Mail is one rendered mail.
type Mail struct {
	// Locale is the locale the mail was rendered in: one of Renderer.Locales.
	Locale  string
	Subject string
	HTML    string
	Text    string
}

// Expiry is a link's life as templates see it (.ExpiresIn): printed, it says the life in English
// words ("24 hours", "1 hour", "30 minutes", "3 days"); its methods give the numbers a template
// in another language words itself ({{.ExpiresIn.Hours}} heures).
type Expiry time.Duration

// String says e in English words; "" for no expiry. Odd durations are rounded up to the minute.
func (e Expiry) String() string {
	if e <= 0 {
		return ""
	}
	return formatExpiry(time.Duration(e))
}

// Days is e in whole days, rounded down.
func (e Expiry) Days() int64 { return int64(time.Duration(e) / (24 * time.Hour)) }

// Hours is e in whole hours, rounded down.
func (e Expiry) Hours() int64 { return int64(time.Duration(e) / time.Hour) }

// Minutes is e in whole minutes, rounded up.
func (e Expiry) Minutes() int64 { return int64((time.Duration(e) + time.Minute - 1) / time.Minute) }

// view is what the mail templates see. html/template escapes every field for its context (text,
// attribute, URL); text/template prints them as they are.
type view struct {
	brand
	Name           string
	ActionURL      string
	ExpiresIn      Expiry
	UnsubscribeURL string
	// Subject is the rendered subject (the text template's "subject"), for the HTML <title>.
	Subject string
}

// brand is what every mail and page shows of the product (from the RendererConfig), and the
// locale it is rendered in.
type brand struct {
	AppName  string
	AppURL   string
	LoginURL string
	// BrandColor is the colour of buttons and links (#rrggbb); BrandTextColor the colour of text
	// on it, white or black, whichever contrasts more (textColorOn).
	BrandColor     string
	BrandTextColor string
	// LogoURL is APP_LOGO_URL, "" for none.
	LogoURL string
	Locale  string
}

// identsOf returns the names a template may use after a dot: the exported fields of the types
// (those of embedded structs included) and their methods.
func identsOf(types ...reflect.Type) map[string]bool {
	idents := map[string]bool{}
	for _, t := range types {
		for i := range t.NumMethod() {
			idents[t.Method(i).Name] = true
		}
		if t.Kind() != reflect.Struct {
			continue
		}
		for _, field := range reflect.VisibleFields(t) {
			if field.IsExported() && !field.Anonymous {
				idents[field.Name] = true
			}
		}
	}
	return idents
}

// family is a set of templates rendered alike: the mail (a layout and a kind, HTML and text)
// or the pages (a layout and a page, HTML only). One loader reads both from the same
// directories, with the same file names, locales, fallbacks and checks.
type family struct {
	// layout is the base name of the family's layout, whose block of the same name is executed.
	layout string
	// bases are the base names of the family's other files.
	bases []string
	// exts are the extensions its files may have.
	exts []string
	// idents are the names its templates may use after a dot (anything else is a typo that
	// would fail only when its branch runs); fields names them for error messages.
	idents map[string]bool
	fields string
}

// has says base is one of the family's files.
func (f *family) has(base string) bool { return base == f.layout || slices.Contains(f.bases, base) }

var mailFamily = &family{ //nolint:gochecknoglobals // computed once from the types
	layout: layoutName,
	bases:  kindBases(),
	exts:   []string{"html", "txt"},
	idents: identsOf(reflect.TypeFor[view](), reflect.TypeFor[Expiry]()),
	fields: ".AppName, .AppURL, .LoginURL, .BrandColor, .BrandTextColor, .LogoURL, .Name, .ActionURL, .ExpiresIn (.Days, .Hours, .Minutes), .UnsubscribeURL, .Locale and .Subject",
}

func kindBases() []string {
	var bases []string
	for _, kind := range Kinds() {
		bases = append(bases, string(kind))
	}
	return bases
}

// families are the template families, in the order errors list their names.
func families() []*family { return []*family{mailFamily, pageFamily} }

//go:embed templates/*.html templates/*.txt
var builtinFS embed.FS

// RendererConfig configures a Renderer.
type RendererConfig struct {
	// AppName is the product name in subjects, greetings, footers and page titles (APP_NAME).
	// Default DefaultAppName.
	AppName string

	// AppURL is the app's base URL (APP_URL), .AppURL in templates and the base of the sample
	// mail's links. Required.
	AppURL string

	// LoginURL is where the pages send people next, and the welcome mail's button
	// (APP_LOGIN_URL), an absolute http(s) URL: .LoginURL in templates. Default AppURL.
	LoginURL string

	// BrandColor is the colour of the built-in templates' buttons and links (APP_BRAND_COLOR),
	// #rrggbb, dark enough for links on white (CheckBrandColor). Default DefaultBrandColor.
	BrandColor string

	// LogoURL is the logo of the built-in mail and pages (APP_LOGO_URL), an absolute http(s)
	// URL (CheckLogoURL), shown with AppName as its text alternative; "" for none.
	LogoURL string

	// TemplatesDir is MAIL_TEMPLATES_DIR: a directory whose templates replace the built-in ones
	// file by file; "" for the built-in ones only. See NewRenderer.
	TemplatesDir string

	// DefaultLocale is the locale of mail and pages whose user's locale has no templates
	// (DEFAULT_LOCALE), a BCP 47 tag. The built-in templates and the templates of TemplatesDir
	// without a locale in their name are this locale's. Default DefaultLocale.
	DefaultLocale string
}

// Renderer renders postguard's mail and pages: each mail kind (Kinds) and each page (Pages) in
// each locale that has templates, from the built-in templates and those of a templates
// directory. It is built and checked once, at start (NewRenderer); rendering is then
// deterministic (the same kind or page, locale and data give the same bytes) and safe for
// concurrent use.
type Renderer struct {
	brand         brand
	logoOrigin    string // LogoURL's origin, for the pages' Content-Security-Policy
	defaultLocale string
	// locales are the locales that have templates, the default first; matcher matches them.
	locales []string
	matcher language.Matcher
	sets    map[setKey]*templateSet
	pages   map[pageKey]*pageSet
	// warnings say where a locale's mail mixes languages (see Warnings).
	warnings []string
}

type setKey struct {
	locale string
	kind   Kind
}

// templateSet is one kind's parsed templates in one locale: each holds a layout and the kind's
// own "content" and "footer" (and "subject" in text), each from the file resolve chose.
type templateSet struct {
	html      *htmltemplate.Template
	text      *texttemplate.Template
	htmlFiles string // the files html was parsed from, for error messages
	textFiles string
}

// source is one template file: its name as errors show it, and its text.
type source struct {
	name string
	text string
}

// fileKey names a template file: welcome.fr.html is {welcome, fr, html}.
type fileKey struct {
	base   string
	locale string // canonical BCP 47, "" for none
	ext    string // "html" or "txt"
}

// NewRenderer loads and checks the templates. The templates directory may hold, besides files
// whose name starts with a dot (which are ignored), only BASE.EXT and BASE.LOCALE.EXT files,
// where BASE is the mail's layout or a kind (welcome, verification, password_reset), EXT html
// (html/template) or txt (text/template, whose "subject" block is the subject); or BASE is the
// pages' page_layout or page_ and a page (page_verify_email, …; see Pages), EXT html; and LOCALE
// a BCP 47 tag (welcome.fr.html, page_error.pt-BR.html). Any other entry is refused, so a
// misspelt name cannot be silently ignored. The locales that have templates are DefaultLocale and
// every LOCALE named in the directory.
//
// A kind or page in a locale is rendered from, for its layout and for its own file, each on its
// own: the file of that locale, else of its parent locales (pt-BR, then pt), else the directory's
// file without a locale, else the built-in one. Every template of every kind and page in every
// locale is rendered at once with sample data (a mail with and without a name, a form with and
// without its errors, the error page for several statuses): a template that does not parse, uses
// a field or a template that does not exist, or renders an empty or multi-line subject or title
// fails NewRenderer with an error naming its file. A field name that does not exist is refused
// even in a branch the samples do not take.
func NewRenderer(config *RendererConfig) (*Renderer, error) {
	if config == nil {
		config = &RendererConfig{}
	}
	if config.AppURL == "" {
		return nil, errors.New("mail: RendererConfig.AppURL is required")
	}
	appURL := strings.TrimRight(config.AppURL, "/")
	r := &Renderer{
		brand: brand{
			AppName:    cmp.Or(config.AppName, DefaultAppName),
			AppURL:     appURL,
			LoginURL:   cmp.Or(config.LoginURL, appURL),
			BrandColor: strings.ToLower(cmp.Or(config.BrandColor, DefaultBrandColor)),
			LogoURL:    config.LogoURL,
		},
		sets:  map[setKey]*templateSet{},
		pages: map[pageKey]*pageSet{},
	}
	if err := checkLinkURL(r.brand.LoginURL); err != nil {
		return nil, fmt.Errorf("mail: RendererConfig.LoginURL %q %w", r.brand.LoginURL, err)
	}
	if err := CheckBrandColor(r.brand.BrandColor); err != nil {
		return nil, fmt.Errorf("mail: RendererConfig.BrandColor: %w", err)
	}
	color, _ := parseHexColor(r.brand.BrandColor)
	r.brand.BrandTextColor = textColorOn(color).String()
	if r.brand.LogoURL != "" {
		origin, err := logoOrigin(r.brand.LogoURL)
		if err != nil {
			return nil, fmt.Errorf("mail: RendererConfig.LogoURL %w", err)
		}
		r.logoOrigin = origin
	}
	defaultTag, err := language.Parse(cmp.Or(config.DefaultLocale, DefaultLocale))
	if err != nil {
		return nil, fmt.Errorf("default locale %q is not a BCP 47 language tag: %w", config.DefaultLocale, err)
	}
	r.defaultLocale = defaultTag.String()

	builtin, err := loadBuiltin()
	if err != nil {
		return nil, err
	}
	dir, err := loadDir(config.TemplatesDir)
	if err != nil {
		return nil, err
	}

	r.locales = []string{r.defaultLocale}
	for key := range dir {
		if key.locale != "" && !slices.Contains(r.locales, key.locale) {
			r.locales = append(r.locales, key.locale)
		}
	}
	slices.Sort(r.locales[1:])
	tags := make([]language.Tag, len(r.locales))
	for i, locale := range r.locales {
		tags[i] = language.MustParse(locale)
	}
	r.matcher = language.NewMatcher(tags)

	// Each of the directory's files alone: parse errors and unknown fields, once per file.
	var errs []error
	broken := map[string]bool{}
	for key, src := range dir {
		if err := checkSource(src, familyOf(key.base)); err != nil {
			errs = append(errs, err)
			broken[src.name] = true
		}
	}

	// resolve finds the file a template of locale comes from, and says whether it is a file of
	// that locale (or of a parent locale) rather than a fallback.
	resolve := func(base, locale, ext string) (source, bool) {
		for tag := language.MustParse(locale); !tag.IsRoot(); tag = tag.Parent() {
			if src, ok := dir[fileKey{base, tag.String(), ext}]; ok {
				return src, true
			}
		}
		if src, ok := dir[fileKey{base, "", ext}]; ok {
			return src, false
		}
		return builtin[fileKey{base, "", ext}], false
	}
	for _, locale := range r.locales {
		for _, kind := range Kinds() {
			htmlLayout, _ := resolve(layoutName, locale, "html")
			htmlKind, htmlLocalized := resolve(string(kind), locale, "html")
			textLayout, _ := resolve(layoutName, locale, "txt")
			textKind, textLocalized := resolve(string(kind), locale, "txt")
			if broken[htmlLayout.name] || broken[htmlKind.name] || broken[textLayout.name] || broken[textKind.name] {
				continue // reported above
			}
			set, err := parseSet(kind, []source{htmlLayout, htmlKind}, []source{textLayout, textKind})
			if err != nil {
				errs = append(errs, err)
				continue
			}
			r.sets[setKey{locale, kind}] = set
			if err := r.checkSet(kind, locale, set); err != nil {
				errs = append(errs, err)
			}
			if htmlLocalized != textLocalized {
				r.warnings = append(r.warnings, fmt.Sprintf(
					"locale %s: the %s mail's HTML comes from %s, its subject and text from %s; add the other file for one language throughout",
					locale, kind, htmlKind.name, textKind.name))
			}
		}
		for _, page := range Pages() {
			layout, _ := resolve(pageLayoutName, locale, "html")
			own, _ := resolve(page.base(), locale, "html")
			if broken[layout.name] || broken[own.name] {
				continue // reported above
			}
			set, err := parsePageSet(page, layout, own)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			r.pages[pageKey{locale, page}] = set
			if err := r.checkPageSet(page, locale, set); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return r, nil
}

// loadBuiltin reads the embedded templates.
func loadBuiltin() (map[fileKey]source, error) {
	builtin := map[fileKey]source{}
	entries, err := fs.ReadDir(builtinFS, "templates")
	if err != nil {
		return nil, fmt.Errorf("error reading built-in templates: %w", err)
	}
	for _, entry := range entries {
		data, err := fs.ReadFile(builtinFS, "templates/"+entry.Name())
		if err != nil {
			return nil, fmt.Errorf("error reading built-in templates: %w", err)
		}
		base, ext, _ := strings.Cut(entry.Name(), ".")
		builtin[fileKey{base, "", ext}] = source{name: "built-in " + entry.Name(), text: string(data)}
	}
	return builtin, nil
}

// loadDir reads the templates directory (see NewRenderer for what it may hold); nil for "".
func loadDir(dir string) (map[fileKey]source, error) {
	if dir == "" {
		return nil, nil
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("error reading templates directory %s: %w", dir, err)
	}
	files := map[fileKey]source{}
	var errs []error
	for _, entry := range entries {
		name := entry.Name()
		path := filepath.Join(dir, name)
		if strings.HasPrefix(name, ".") {
			continue // editors' and file managers' own files
		}
		key, err := parseFileName(name)
		if err == nil && !entry.Type().IsRegular() && entry.Type()&fs.ModeSymlink == 0 {
			err = errors.New("is not a file")
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", path, err))
			continue
		}
		if other, ok := files[key]; ok {
			errs = append(errs, fmt.Errorf("%s: names the same template as %s", path, other.name))
			continue
		}
		data, err := os.ReadFile(path) //nolint:gosec // the operator's own templates directory
		if err != nil {
			errs = append(errs, fmt.Errorf("error reading template: %w", err))
			continue
		}
		files[key] = source{name: path, text: string(data)}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return files, nil
}

// familyOf is the family a base name belongs to; nil for none.
func familyOf(base string) *family {
	for _, f := range families() {
		if f.has(base) {
			return f
		}
	}
	return nil
}

// parseFileName reads BASE.EXT or BASE.LOCALE.EXT.
func parseFileName(name string) (fileKey, error) {
	parts := strings.Split(name, ".")
	var key fileKey
	switch len(parts) {
	case 2:
		key = fileKey{base: parts[0], ext: parts[1]}
	case 3:
		tag, err := language.Parse(parts[1])
		if err != nil {
			return key, fmt.Errorf("%q is not a BCP 47 language tag (expected BASE.LOCALE.EXT, such as welcome.fr.html or welcome.pt-BR.txt)", parts[1])
		}
		key = fileKey{base: parts[0], locale: tag.String(), ext: parts[2]}
	default:
		return key, errors.New("is not a template name (expected BASE.EXT or BASE.LOCALE.EXT, such as welcome.html or welcome.fr.txt)")
	}
	f := familyOf(key.base)
	if f == nil {
		var bases []string
		for _, f := range families() {
			bases = append(append(bases, f.layout), f.bases...)
		}
		return key, fmt.Errorf("%q is not a template (expected one of %s)", key.base, strings.Join(bases, ", "))
	}
	if !slices.Contains(f.exts, key.ext) {
		if f == pageFamily {
			return key, fmt.Errorf("%q is not a page template extension (pages are html only)", key.ext)
		}
		return key, fmt.Errorf("%q is not a template extension (expected html or txt)", key.ext)
	}
	return key, nil
}

// checkSource parses one file on its own (HTML and text templates share their syntax) and refuses
// the field names the templates of its family cannot see.
func checkSource(src source, f *family) error {
	t, err := texttemplate.New(src.name).Parse(src.text)
	if err != nil {
		return err
	}
	var errs []error
	for _, tmpl := range t.Templates() {
		tree := tmpl.Tree
		if tree == nil || tree.Root == nil {
			continue
		}
		walkIdents(tree.Root, func(node parse.Node, ident string) {
			if !f.idents[ident] {
				location, _ := tree.ErrorContext(node)
				errs = append(errs, fmt.Errorf("%s: unknown field .%s (templates see %s)", location, ident, f.fields))
			}
		})
	}
	return errors.Join(errs...)
}

// walkIdents calls fn for every name after a dot in node: .Name, $x.Name, (pipe).Name.
func walkIdents(node parse.Node, fn func(node parse.Node, ident string)) {
	switch n := node.(type) {
	case *parse.ListNode:
		if n == nil {
			return
		}
		for _, child := range n.Nodes {
			walkIdents(child, fn)
		}
	case *parse.ActionNode:
		walkIdents(n.Pipe, fn)
	case *parse.IfNode:
		walkBranch(&n.BranchNode, fn)
	case *parse.RangeNode:
		walkBranch(&n.BranchNode, fn)
	case *parse.WithNode:
		walkBranch(&n.BranchNode, fn)
	case *parse.TemplateNode:
		walkIdents(n.Pipe, fn)
	case *parse.PipeNode:
		if n == nil {
			return
		}
		for _, cmd := range n.Cmds {
			walkIdents(cmd, fn)
		}
	case *parse.CommandNode:
		for _, arg := range n.Args {
			walkIdents(arg, fn)
		}
	case *parse.FieldNode:
		for _, ident := range n.Ident {
			fn(n, ident)
		}
	case *parse.ChainNode:
		walkIdents(n.Node, fn)
		for _, ident := range n.Field {
			fn(n, ident)
		}
	case *parse.VariableNode:
		for _, ident := range n.Ident[1:] {
			fn(n, ident)
		}
	}
}

func walkBranch(n *parse.BranchNode, fn func(node parse.Node, ident string)) {
	walkIdents(n.Pipe, fn)
	walkIdents(n.List, fn)
	walkIdents(n.ElseList, fn)
}

// parseSet parses one kind's layout and own file, HTML and text. missingkey=error makes a
// missing key an error rather than "<no value>" (the view is a struct, whose unknown fields are
// errors anyway).
func parseSet(kind Kind, html, text []source) (*templateSet, error) {
	set := &templateSet{
		html:      htmltemplate.New(string(kind)).Option("missingkey=error"),
		text:      texttemplate.New(string(kind)).Option("missingkey=error"),
		htmlFiles: html[1].name + " in " + html[0].name,
		textFiles: text[1].name + " in " + text[0].name,
	}
	for _, src := range html {
		if _, err := set.html.New(src.name).Parse(src.text); err != nil {
			return nil, err
		}
	}
	for _, src := range text {
		if _, err := set.text.New(src.name).Parse(src.text); err != nil {
			return nil, err
		}
	}
	return set, nil
}

// checkSet renders set with the sample data, with and without a name.
func (r *Renderer) checkSet(kind Kind, locale string, set *templateSet) error {
	data := sampleData(kind, &r.brand)
	if _, err := r.execute(kind, locale, set, data); err != nil {
		return err
	}
	data.Name = ""
	_, err := r.execute(kind, locale, set, data)
	return err
}

// sampleData is the data the templates are checked and previewed with: a user named Ada
// Lovelace, links of the service's own form with made-up tokens.
func sampleData(kind Kind, b *brand) *Data {
	appURL := b.AppURL
	const sampleToken = "c2FtcGxlLXRva2VuLW5vdC1hLXJlYWwtb25lLWV2ZXI" //nolint:gosec // a made-up token of the real form, for samples
	data := &Data{Name: "Ada Lovelace"}
	switch kind {
	case KindWelcome:
		data.ActionURL = b.LoginURL
		data.UnsubscribeURL = appURL + "/v1/unsubscribe?token=1.c2FtcGxl"
	case KindVerification:
		data.ActionURL = appURL + "/v1/auth/verify-email?token=" + sampleToken
		data.ExpiresIn = DefaultVerificationExpiry
	case KindPasswordReset:
		data.ActionURL = appURL + "/v1/auth/reset-password?token=" + sampleToken
		data.ExpiresIn = DefaultPasswordResetExpiry
	}
	return data
}

// Locales returns the locales that have templates, DefaultLocale first.
func (r *Renderer) Locales() []string { return slices.Clone(r.locales) }

// DefaultLocale returns the locale of mail whose user's locale has no templates.
func (r *Renderer) DefaultLocale() string { return r.defaultLocale }

// AppName returns the product name the mail and pages carry.
func (r *Renderer) AppName() string { return r.brand.AppName }

// LogoURL returns the logo the built-in mail and pages show, "" for none.
func (r *Renderer) LogoURL() string { return r.brand.LogoURL }

// Warnings say where a locale's mail mixes languages: a kind whose HTML has a file of the locale
// and whose text does not, or the other way round. They are worth logging at start.
func (r *Renderer) Warnings() []string { return slices.Clone(r.warnings) }

// Match returns the locale a user whose locale is preference (a BCP 47 tag, or "" when unknown)
// gets mail in: the best match among Locales (golang.org/x/text/language), else the default
// locale. A locale of Locales matches itself.
func (r *Renderer) Match(preference string) string {
	if slices.Contains(r.locales, preference) {
		return preference
	}
	tag, err := language.Parse(preference)
	if preference == "" || err != nil {
		return r.defaultLocale
	}
	_, index, confidence := r.matcher.Match(tag)
	if confidence == language.No {
		return r.defaultLocale
	}
	return r.locales[index]
}

// MatchAcceptLanguage returns the locale of a page for a visitor whose browser sent header
// (Accept-Language): the best match among Locales of the languages it lists, in their order of
// preference, else the default locale. A malformed or oversized header is no preference.
func (r *Renderer) MatchAcceptLanguage(header string) string {
	if header == "" || len(header) > maxAcceptLanguageLen {
		return r.defaultLocale
	}
	tags, _, err := language.ParseAcceptLanguage(header)
	if err != nil || len(tags) == 0 {
		return r.defaultLocale
	}
	_, index, confidence := r.matcher.Match(tags...)
	if confidence == language.No {
		return r.defaultLocale
	}
	return r.locales[index]
}

// maxAcceptLanguageLen bounds the Accept-Language header MatchAcceptLanguage parses: a browser
// sends a few dozen bytes.
const maxAcceptLanguageLen = 1024

// Render renders kind for a user whose locale is locale (see Match), with data.
func (r *Renderer) Render(kind Kind, locale string, data *Data) (*Mail, error) {
	if data == nil {
		return nil, fmt.Errorf("error rendering %s mail: no data", kind)
	}
	if data.ActionURL == "" {
		return nil, fmt.Errorf("error rendering %s mail: ActionURL is required", kind)
	}
	if kind == KindWelcome && data.UnsubscribeURL == "" {
		return nil, fmt.Errorf("error rendering %s mail: UnsubscribeURL is required", kind)
	}
	locale = r.Match(locale)
	set, ok := r.sets[setKey{locale, kind}]
	if !ok {
		return nil, fmt.Errorf("error rendering mail: unknown kind %q", kind)
	}
	return r.execute(kind, locale, set, data)
}

// RenderSample renders kind in locale (see Match) with the sample data the templates are checked
// with: what `postguard mail preview` writes.
func (r *Renderer) RenderSample(kind Kind, locale string) (*Mail, error) {
	return r.Render(kind, locale, sampleData(kind, &r.brand))
}

func (r *Renderer) execute(kind Kind, locale string, set *templateSet, data *Data) (*Mail, error) {
	v := &view{
		brand:          r.brand,
		Name:           strings.TrimSpace(data.Name),
		ActionURL:      data.ActionURL,
		ExpiresIn:      Expiry(data.ExpiresIn),
		UnsubscribeURL: data.UnsubscribeURL,
	}
	v.Locale = locale
	var buf bytes.Buffer
	if err := set.text.ExecuteTemplate(&buf, "subject", v); err != nil {
		return nil, fmt.Errorf("error rendering %s mail's subject, locale %s, from %s: %w", kind, locale, set.textFiles, err)
	}
	v.Subject = strings.TrimSpace(buf.String())
	if v.Subject == "" || strings.ContainsAny(v.Subject, "\r\n") {
		return nil, fmt.Errorf("error rendering %s mail, locale %s, from %s: the subject block must render one line of text, got %s", kind, locale, set.textFiles, strconv.Quote(v.Subject))
	}

	buf.Reset()
	if err := set.html.ExecuteTemplate(&buf, layoutName, v); err != nil {
		return nil, fmt.Errorf("error rendering %s mail's HTML, locale %s, from %s: %w", kind, locale, set.htmlFiles, err)
	}
	html := buf.String()

	buf.Reset()
	if err := set.text.ExecuteTemplate(&buf, layoutName, v); err != nil {
		return nil, fmt.Errorf("error rendering %s mail's text, locale %s, from %s: %w", kind, locale, set.textFiles, err)
	}
	return &Mail{Locale: locale, Subject: v.Subject, HTML: html, Text: buf.String()}, nil
}

// formatExpiry says a link's life in words: "24 hours", "1 hour", "30 minutes", "3 days". Odd
// durations are rounded up to the minute.
func formatExpiry(d time.Duration) string {
	plural := func(n int64, unit string) string {
		if n == 1 {
			return "1 " + unit
		}
		return strconv.FormatInt(n, 10) + " " + unit + "s"
	}

	const day = 24 * time.Hour
	switch {
	case d >= 2*day && d%day == 0:
		return plural(int64(d/day), "day")
	case d >= time.Hour && d%time.Hour == 0:
		return plural(int64(d/time.Hour), "hour")
	}
	return plural(int64((d+time.Minute-1)/time.Minute), "minute")
}
