// Parse LogQL queries with Grafana's own LogQL grammar (@grafana/lezer-logql, what Grafana's Loki query editor
// parses with) and say what each holds: syntax errors, the stream selector's matchers, the json parser's
// extractions, the label filters and the line_format template. Run by scripts/check-logql, which installs the
// grammar; reads a JSON array of queries on stdin, writes a JSON array of results on stdout.
import { parser } from "@grafana/lezer-logql";

function text(query, node) {
  return query.slice(node.from, node.to);
}

function unquote(s) {
  // LogQL strings: "..." with Go escapes, or `...` raw
  if (s.startsWith("`")) return s.slice(1, -1);
  return JSON.parse(s);
}

function matcher(query, node) {
  const out = {};
  for (let child = node.firstChild; child; child = child.nextSibling) {
    if (child.name === "Identifier") out.label = text(query, child);
    else if (child.name === "String") out.value = unquote(text(query, child));
    else out.op = text(query, child);
  }
  return out;
}

function inside(node, name) {
  for (let up = node.parent; up; up = up.parent) if (up.name === name) return true;
  return false;
}

function analyse(query) {
  const tree = parser.parse(query);
  const result = { query, errors: [], selector: [], extractions: [], label_filters: [], line_filters: [],
                   line_format: null, stages: [] };
  tree.iterate({
    enter: (ref) => {
      const node = ref.node;
      if (node.type.isError) {
        result.errors.push({ at: node.from, near: query.slice(Math.max(0, node.from - 20), node.from + 20) });
      } else if (node.name === "Matcher" && inside(node, "Selector")) {
        result.selector.push(matcher(query, node));
      } else if (node.name === "Matcher" && inside(node, "LabelFilter")) {
        result.label_filters.push(matcher(query, node));
      } else if (node.name === "LabelExtractionExpression") {
        const m = matcher(query, node);
        result.extractions.push({ label: m.label, path: m.value === undefined ? m.label : m.value });
      } else if (node.name === "LineFilter") {
        const s = node.getChild("String");
        result.line_filters.push({ op: text(query, node.firstChild), value: s ? unquote(text(query, s)) : null });
      } else if (node.name === "LineFormatExpr") {
        const s = node.getChild("String");
        result.line_format = s ? unquote(text(query, s)) : null;
      } else if (node.name === "PipelineStage") {
        const first = node.firstChild;
        const kind = first && first.name === "Pipe" ? first.nextSibling : first;
        result.stages.push(kind ? kind.name : null);
      }
    },
  });
  return result;
}

let input = "";
process.stdin.setEncoding("utf8");
process.stdin.on("data", (chunk) => { input += chunk; });
process.stdin.on("end", () => {
  const queries = JSON.parse(input);
  process.stdout.write(JSON.stringify(queries.map(analyse)) + "\n");
});
