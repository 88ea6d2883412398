// The finder page's script (factory/index/finder.py inlines it): filter, sort, installers,
// copy buttons; the view's state in the URL.
const base = new URL("../", document.location.href);
const root = base.href;
// plain http by host name: pip and PDM must be told to trust it (as factory doctor prints it)
const loopback = base.hostname === "localhost" || /^127[.]/.test(base.hostname)
  || base.hostname === "[::1]";
const trusted = base.protocol === "http:" && !loopback;
const allTemplates = JSON.parse(document.getElementById("install-templates").textContent);
const templates = trusted ? allTemplates.trust : allTemplates.plain;
const gpus = JSON.parse(document.getElementById("gpus").textContent);
const tokens = JSON.parse(document.getElementById("tokens").textContent);
const table = document.getElementById("wheels");
const rows = Array.from(table.querySelectorAll("tbody.wheel"));
const filter = document.getElementById("filter");
const count = document.getElementById("count");
const note = document.getElementById("gpu-note");
const params = new URLSearchParams(document.location.search);
let sort = params.get("sort") || "";
let installer = params.get("with") || "pip";
if (!(installer in templates)) installer = "pip";
filter.value = params.get("q") || "";
document.getElementById("doctor-line").textContent = "factory doctor --index " + root;

function norm(s) { return s.toLowerCase().replace(/[^a-z0-9]/g, ""); }
const products = Object.keys(gpus).sort((a, b) => norm(b).length - norm(a).length);
function runs(built, gpu) { return Math.floor(built / 10) === Math.floor(gpu / 10) && gpu >= built; }

function parse(query) {
  // product names first (longest first: "rtx pro 6000" before "rtx 6000 ada"), then words
  let rest = " " + query.toLowerCase() + " ";
  const named = [];
  for (const name of products) {
    const words = name.toLowerCase().split(/[^a-z0-9]+/).filter(w => w);
    const re = new RegExp("(^|[^a-z0-9])" + words.join("[\\s_-]*") + "(?![a-z0-9])", "g");
    if (re.test(rest)) {
      named.push(name);
      rest = rest.replace(re, "$1 ");
    }
  }
  return {named, words: rest.split(/\s+/).filter(w => w)};
}

// what a row's install line needs, from its own cells and links (not repeated as attributes:
// the page lists every wheel of the index)
function facts(row) {
  if (!row.facts) {
    row.facts = {
      project: row.querySelector("td[data-key=package]").textContent,
      version: row.querySelector("td[data-key=version]").textContent,
      path: row.querySelector("a.variant-link").getAttribute("href").replace(/^\.\.\//, ""),
    };
  }
  return row.facts;
}

function installText(row) {
  const f = facts(row);
  return templates[installer].split(trusted ? tokens.trust_root : tokens.root).join(root)
    .split(tokens.host).join(base.host)
    .split(tokens.path).join(f.path)
    .split(tokens.project).join(f.project)
    .split(tokens.version).join(f.version);
}

function render() {
  for (const row of rows) row.querySelector("pre.install-text").textContent = installText(row);
}

function apply() {
  const q = parse(filter.value);
  let shown = 0;
  for (const row of rows) {
    const text = row.querySelector("tr.facts").textContent.toLowerCase();
    const archs = (row.dataset.archs || "").split(" ").filter(a => a).map(Number);
    const fits = q.named.every(name => archs.length === 0 || archs.some(a => runs(a, gpus[name])));
    const ok = fits && q.words.every(w => text.includes(w));
    row.hidden = !ok;
    if (ok) shown++;
  }
  count.textContent = shown + " of " + rows.length + " wheels";
  note.textContent = q.named.map(name => {
    const sm = gpus[name];
    return name + " is sm_" + sm + " (compute capability " + Math.floor(sm / 10) + "." + sm % 10
      + "): wheels whose archs run on it";
  }).join("; ");
  save();
}

function save() {
  const p = new URLSearchParams();
  if (filter.value) p.set("q", filter.value);
  if (sort) p.set("sort", sort);
  if (installer !== "pip") p.set("with", installer);
  const search = p.toString();
  history.replaceState(null, "", search ? "?" + search : document.location.pathname);
}

function sortBy(spec) {
  const [key, dir] = spec.split("-");
  for (const th of table.querySelectorAll("thead th[data-key]")) {
    th.setAttribute("aria-sort", th.dataset.key === key ? (dir === "desc" ? "descending" : "ascending") : "none");
  }
  const value = row => {
    const td = row.querySelector("td[data-key=" + key + "]");
    return td.dataset.sort === undefined ? td.textContent : td.dataset.sort;
  };
  // numbers in the text compare as numbers ("2.9" before "2.14"); the rest as text
  const parts = text => text.split(/(\d+)/).map((p, i) => i % 2 ? Number(p) : p);
  const compare = (a, b) => {
    const x = parts(value(a)), y = parts(value(b));
    for (let i = 0; i < Math.min(x.length, y.length); i++) {
      if (x[i] !== y[i]) return x[i] < y[i] ? -1 : 1;
    }
    return x.length - y.length;
  };
  const sorted = rows.slice().sort(compare);
  if (dir === "desc") sorted.reverse();
  for (const row of sorted) table.appendChild(row);
}

for (const th of table.querySelectorAll("thead th[data-key]")) {
  th.querySelector("button").addEventListener("click", () => {
    const key = th.dataset.key;
    sort = key + (sort === key + "-asc" ? "-desc" : "-asc");
    sortBy(sort);
    save();
  });
}

function copy(text, button) {
  const done = () => { button.textContent = "copied"; setTimeout(() => button.textContent = "copy", 1500); };
  if (navigator.clipboard && window.isSecureContext) {
    navigator.clipboard.writeText(text).then(done, () => fallback(text, done));
  } else {
    fallback(text, done);
  }
}
function fallback(text, done) {
  // no clipboard API outside a secure context (plain http by host name): a selected textarea
  const area = document.createElement("textarea");
  area.value = text;
  area.setAttribute("readonly", "");
  area.style.position = "fixed";
  area.style.opacity = "0";
  document.body.appendChild(area);
  area.select();
  document.execCommand("copy");
  document.body.removeChild(area);
  done();
}
document.addEventListener("click", event => {
  const button = event.target.closest("button.copy");
  if (!button) return;
  const text = button.parentElement.querySelector("pre, code");
  copy(text.textContent, button);
});

for (const radio of document.querySelectorAll("input[name=installer]")) {
  radio.checked = radio.value === installer;
  radio.addEventListener("change", () => { installer = radio.value; render(); save(); });
}
// the coverage page exists only where 'factory matrix --html' wrote it into the tree
const coverage = document.getElementById("coverage-link");
fetch(coverage.href, {method: "HEAD"}).then(r => { if (!r.ok) coverage.hidden = true; },
                                              () => { coverage.hidden = true; });
// each arch cell names the GPUs its kernels run on (from the same table the filter uses)
for (const row of rows) {
  const archs = (row.dataset.archs || "").split(" ").filter(a => a).map(Number);
  if (!archs.length) continue;
  const names = Object.keys(gpus).filter(name => archs.some(a => runs(a, gpus[name])));
  row.querySelector("td[data-key=arch]").title = "runs on: " + (names.join(", ") || "no GPU in the table");
}
filter.addEventListener("input", apply);
if (sort) sortBy(sort);
render();
apply();
