#!/usr/bin/env node
/* validate.js — offline checks of pstrain's Kubernetes manifests (no cluster needed).
 *
 *   node validate.js [--cases DIR] [PATH ...]
 *     PATH: manifest files or directories (default: every deploy/k8s*\/ directory).
 *     1. parses every YAML document and validates it against the Kubernetes schema of its
 *        apiVersion/kind (the kubernetes-models classes' .validate()), and also rejects
 *        fields the schema does not know (the schemas alone accept `replica: 2`);
 *     2. checks what the documents of one directory must agree on (Service <-> StatefulSet,
 *        Indexed Job completions = parallelism, referenced ConfigMaps and
 *        PersistentVolumeClaims exist, selectors), and what checkpoints and recovery need:
 *        a checkpoint directory (PSTRAIN_CHECKPOINT_DIR or --checkpoint-dir) on a writable
 *        volume backed by a PersistentVolumeClaim, a pserver id with it, and a trainer Job
 *        that retries failed pods when its trainers wait for restarts (PSTRAIN_ON_FAILURE);
 *     3. with --cases DIR: for every container of every pod the workloads would create
 *        (each Job completion index, each StatefulSet ordinal), resolves the environment
 *        as the kubelet would (envFrom + env, $(VAR) expansion, fieldRef/resourceFieldRef
 *        substituted with realistic values) and writes a case for tests/deploy_check.sh:
 *          DIR/cases.tsv          name, program, expected exit status, stderr must contain
 *          DIR/<name>.env         KEY=VALUE lines (the container's whole environment)
 *          DIR/<name>.args        the container's arguments, one per line
 *          DIR/<name>.expect.json what `<program> --check-config` must report
 *        plus negative cases (a broken variable, a completion index past the trainer count)
 *        that must exit 2 with one line naming the variable.
 *     Exit status 0 when everything is valid, 1 otherwise (each problem on one line:
 *     file, document number, kind/name, error).
 *
 *   node validate.js --compare EXPECT.json OUTPUT
 *     checks that OUTPUT is one JSON line (a --check-config output) with the expected values.
 *   node validate.js --same OUTPUT_A OUTPUT_B [KEY,KEY...]
 *     checks that two --check-config outputs agree on every key but the listed ones.
 *   node validate.js --get KEY OUTPUT
 *     prints one value of a --check-config output.
 */
'use strict';

const fs = require('fs');
const path = require('path');
const yaml = require('js-yaml');

/* Values the kubelet would substitute for fieldRef paths (per pod ones are added below). */
const POD_IP = '10.0.0.5';
const STATIC_FIELDS = {
  'status.podIP': POD_IP,
  'status.podIPs': POD_IP,
  'status.hostIP': '10.0.0.1',
  'status.hostIPs': '10.0.0.1',
  'spec.nodeName': 'node-1',
  'spec.serviceAccountName': 'default',
  'metadata.namespace': 'default',
  'metadata.uid': '00000000-0000-4000-8000-000000000000',
};
const PROGRAMS = ['trainer', 'pserver'];
const ENV_NAME = /^[-._a-zA-Z][-._a-zA-Z0-9]*$/;

const problems = [];
function problem(where, msg) {
  problems.push(`${where}: ${msg}`);
}

/* ---- schema validation ---- */

function modelClass(apiVersion, kind) {
  if (typeof apiVersion !== 'string' || !/^([a-z0-9.-]+\/)?v[0-9a-z]+$/.test(apiVersion))
    return null;
  if (typeof kind !== 'string' || !/^[A-Z][A-Za-z0-9]*$/.test(kind))
    return null;
  let mod;
  try {
    mod = require(`kubernetes-models/${apiVersion}`);
  } catch (e) {
    return null;
  }
  return typeof mod[kind] === 'function' ? mod[kind] : null;
}

function isPlainObject(v) {
  return v !== null && typeof v === 'object' && !Array.isArray(v);
}

/* The generated schema validators read every property their schema defines. Running the
 * validator on a Proxy that records those reads tells which keys of the document it knows;
 * any other key of an object it inspected is unknown to the schema (a typo, or a field of
 * a newer Kubernetes). Objects it never inspects (free-form maps) are not judged. */
function unknownFields(Model, doc) {
  const reads = new WeakMap();
  const wrap = (v) => {
    if (v === null || typeof v !== 'object') return v;
    if (!reads.has(v)) reads.set(v, new Set());
    return new Proxy(v, {
      get(target, key, receiver) {
        if (typeof key === 'string') reads.get(target).add(key);
        return wrap(Reflect.get(target, key, receiver));
      },
    });
  };
  Model.prototype.validate.call(wrap(doc));
  const unknown = [];
  const walk = (v, at) => {
    if (Array.isArray(v)) {
      v.forEach((x, i) => walk(x, `${at}/${i}`));
    } else if (isPlainObject(v)) {
      const seen = reads.get(v);
      for (const k of Object.keys(v)) {
        if (seen && seen.size > 0 && !seen.has(k)) unknown.push(`${at}/${k}`);
        else walk(v[k], `${at}/${k}`);
      }
    }
  };
  walk(doc, '');
  return unknown;
}

function loadDocuments(file) {
  const docs = [];
  let parsed;
  try {
    parsed = yaml.loadAll(fs.readFileSync(file, 'utf8'), null, { filename: file });
  } catch (e) {
    problem(file, `YAML: ${e.message.split('\n')[0]}`);
    return docs;
  }
  parsed.forEach((doc, i) => {
    if (doc === null || doc === undefined) return;
    const where = `${file}: document ${i + 1}`;
    if (!isPlainObject(doc)) {
      problem(where, 'not a mapping');
      return;
    }
    const label = `${doc.kind}/${doc.metadata && doc.metadata.name}`;
    const Model = modelClass(doc.apiVersion, doc.kind);
    if (!Model) {
      problem(`${where} (${label})`, `unknown apiVersion/kind ${doc.apiVersion} ${doc.kind}`);
      return;
    }
    try {
      new Model(doc).validate();
    } catch (e) {
      problem(`${where} (${label})`, e.message);
      return;
    }
    const unknown = unknownFields(Model, doc);
    if (unknown.length) {
      problem(`${where} (${label})`,
        `field(s) not in the ${doc.apiVersion} ${doc.kind} schema: ${unknown.join(', ')}`);
      return;
    }
    docs.push({ file, index: i + 1, where: `${where} (${label})`, doc });
  });
  return docs;
}

/* ---- the environment a container gets ---- */

/* Kubernetes' $(VAR) expansion: $$ is a literal $, $(NAME) is replaced when NAME is
 * defined, and kept as written when it is not. */
function expand(s, vars) {
  let out = '';
  for (let i = 0; i < s.length; i++) {
    if (s[i] !== '$' || i + 1 >= s.length) {
      out += s[i];
    } else if (s[i + 1] === '$') {
      out += '$';
      i++;
    } else if (s[i + 1] === '(' && s.indexOf(')', i + 2) >= 0) {
      const close = s.indexOf(')', i + 2);
      const name = s.slice(i + 2, close);
      out += Object.prototype.hasOwnProperty.call(vars, name) ? vars[name] : s.slice(i, close + 1);
      i = close;
    } else {
      out += '$';
    }
  }
  return out;
}

const SUFFIX = {
  n: 1e-9, u: 1e-6, m: 1e-3, '': 1, k: 1e3, M: 1e6, G: 1e9, T: 1e12, P: 1e15, E: 1e18,
  Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40, Pi: 2 ** 50, Ei: 2 ** 60,
};
function quantity(q) {
  const m = /^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(n|u|m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$/.exec(String(q));
  if (!m) throw new Error(`bad quantity ${q}`);
  return Number(m[1]) * SUFFIX[m[2] || ''];
}

function fieldValue(fieldPath, pod) {
  const m = /^metadata\.(annotations|labels)\['([^']+)'\]$/.exec(fieldPath);
  if (m) {
    const map = pod[m[1]];
    if (!Object.prototype.hasOwnProperty.call(map, m[2]))
      throw new Error(`fieldRef ${fieldPath}: the pod has no such ${m[1].slice(0, -1)} (it would be empty)`);
    return map[m[2]];
  }
  if (fieldPath === 'metadata.name') return pod.name;
  if (Object.prototype.hasOwnProperty.call(STATIC_FIELDS, fieldPath)) return STATIC_FIELDS[fieldPath];
  throw new Error(`fieldRef ${fieldPath}: no test value known for this field`);
}

function resourceValue(ref, container) {
  const [kind, res] = String(ref.resource).split('.');
  const q = container.resources && container.resources[kind] && container.resources[kind][res];
  if (q === undefined)
    throw new Error(`resourceFieldRef ${ref.resource}: the container sets no ${ref.resource} ` +
      `(the value would be the node's allocatable ${res})`);
  return String(Math.ceil(quantity(q) / quantity(ref.divisor || '1') - 1e-9));
}

/* The environment of `container` in `pod`, in the kubelet's order: envFrom sources, then
 * env entries (each may use $(VAR) of what precedes it). */
function resolveEnv(container, pod, configMaps) {
  const env = {};
  for (const src of container.envFrom || []) {
    if (src.secretRef) throw new Error('envFrom secretRef: secrets cannot be resolved offline');
    const ref = src.configMapRef;
    const data = configMaps[ref.name];
    if (!data) {
      if (ref.optional) continue;
      throw new Error(`envFrom: ConfigMap ${ref.name} is not defined next to this manifest`);
    }
    for (const [k, v] of Object.entries(data)) {
      const name = (src.prefix || '') + k;
      if (ENV_NAME.test(name)) env[name] = String(v);
    }
  }
  for (const e of container.env || []) {
    let v;
    if (e.valueFrom) {
      const vf = e.valueFrom;
      if (vf.fieldRef) v = fieldValue(vf.fieldRef.fieldPath, pod);
      else if (vf.resourceFieldRef) v = resourceValue(vf.resourceFieldRef, container);
      else if (vf.configMapKeyRef) {
        const data = configMaps[vf.configMapKeyRef.name];
        if (data && Object.prototype.hasOwnProperty.call(data, vf.configMapKeyRef.key))
          v = String(data[vf.configMapKeyRef.key]);
        else if (vf.configMapKeyRef.optional) continue;
        else throw new Error(`env ${e.name}: ConfigMap key ${vf.configMapKeyRef.name}/${vf.configMapKeyRef.key} is not defined next to this manifest`);
      } else throw new Error(`env ${e.name}: this valueFrom cannot be resolved offline`);
    } else {
      v = expand(e.value === undefined ? '' : String(e.value), env);
    }
    env[e.name] = v;
  }
  for (const [k, v] of Object.entries(env))
    if (v.includes('\n') || v.includes('\0')) throw new Error(`env ${k}: value has a newline or NUL`);
  return env;
}

/* ---- what the documents of one directory must agree on ---- */

/* A setting as the program resolves it: the last --flag (--flag=V or --flag V) wins over
 * the environment. Returns { value, source } (source: how to name it in a message), or
 * null when neither sets it. */
function settingOf(env, args, flag, envName) {
  let found = null;
  for (let i = 0; i < args.length; i++) {
    if (args[i] === `--${flag}` && i + 1 < args.length) found = { value: args[++i], source: `--${flag}` };
    else if (args[i].startsWith(`--${flag}=`)) found = { value: args[i].slice(flag.length + 3), source: `--${flag}` };
  }
  if (found) return found;
  return Object.prototype.hasOwnProperty.call(env, envName) ? { value: env[envName], source: envName } : null;
}

function checkpointDirOf(env, args) {
  const s = settingOf(env, args, 'checkpoint-dir', 'PSTRAIN_CHECKPOINT_DIR');
  return s && s.value !== '' ? s : null;
}

function onFailureOf(env, args) {
  const s = settingOf(env, args, 'on-failure', 'PSTRAIN_ON_FAILURE');
  return s ? s.value : 'fail';
}

/* The volume mounted at `dir` or the nearest folder above it in container `c` of workload
 * `w`: { mount, kind } where kind is 'claim' (a volumeClaimTemplates entry of a StatefulSet
 * or a persistentVolumeClaim volume) or the volume's source (emptyDir, hostPath, ...);
 * null when dir is on the container's own filesystem. */
function volumeAt(w, c, dir) {
  const under = (m) => dir === m || dir.startsWith(m.endsWith('/') ? m : `${m}/`);
  let best = null;
  for (const m of c.volumeMounts || [])
    if (under(m.mountPath) && (!best || m.mountPath.length > best.mountPath.length)) best = m;
  if (!best) return null;
  /* A StatefulSet's claim template replaces a pod volume of the same name. */
  if (w.kind === 'StatefulSet' && (w.spec.volumeClaimTemplates || []).some((t) => t.metadata && t.metadata.name === best.name))
    return { mount: best, kind: 'claim' };
  const v = (w.tmpl.spec.volumes || []).find((x) => x.name === best.name);
  if (!v) return { mount: best, kind: 'undefined' };
  if (v.persistentVolumeClaim) return { mount: best, kind: 'claim' };
  return { mount: best, kind: Object.keys(v).find((k) => k !== 'name') || 'undefined' };
}

/* Checkpoints and recovery, for container `c` of workload `w` under the environment of
 * its first pod. */
function checkRecovery(w, c, env, args) {
  const where = `${w.d.where} container ${c.name}`;
  const program = programOf(c);
  const dir = checkpointDirOf(env, args);
  if (dir) {
    const at = `${dir.source}=${dir.value}`;
    const vol = dir.value.startsWith('/') ? volumeAt(w, c, dir.value) : null;
    if (!dir.value.startsWith('/'))
      problem(where, `${at}: not an absolute path (it would be relative to the image's working directory); mount a PersistentVolumeClaim and name its mountPath`);
    else if (!vol)
      problem(where, `${at}: no volume is mounted there, so checkpoints would go to the container's root filesystem (read-only here, and lost with the pod); mount a PersistentVolumeClaim (volumeClaimTemplates or persistentVolumeClaim) at ${dir.value}`);
    else if (vol.kind === 'undefined')
      problem(where, `${at}: volumeMount ${vol.mount.name} names no volume of the pod`);
    else if (vol.kind !== 'claim')
      problem(where, `${at}: volume ${vol.mount.name} mounted at ${vol.mount.mountPath} is ${vol.kind}, not a PersistentVolumeClaim: checkpoints must outlive the pod (volumeClaimTemplates or persistentVolumeClaim)`);
    else if (vol.mount.readOnly)
      problem(where, `${at}: volume ${vol.mount.name} is mounted read-only at ${vol.mount.mountPath}`);
    if (program === 'pserver' && !settingOf(env, args, 'pserver-id', 'PSTRAIN_PSERVER_ID'))
      problem(where, `${at} without PSTRAIN_PSERVER_ID (or --pserver-id): each pserver's shard goes to ` +
        `${dir.value}/pserver-<id>; set it to the StatefulSet ordinal (fieldRef metadata.labels['apps.kubernetes.io/pod-index'])`);
  }
  const onFailure = settingOf(env, args, 'on-failure', 'PSTRAIN_ON_FAILURE');
  if (w.kind === 'Job' && onFailure && onFailure.value === 'wait') {
    /* backoffLimit defaults to 6; with backoffLimitPerIndex, that is the budget per index. */
    const perIndex = w.spec.backoffLimitPerIndex;
    const budget = perIndex !== undefined && perIndex !== null ? perIndex
      : w.spec.backoffLimit === undefined || w.spec.backoffLimit === null ? 6 : w.spec.backoffLimit;
    if (!(budget > 0))
      problem(where, `${onFailure.source}=wait: the other processes wait for a failed trainer to be started again, ` +
        `but the Job retries no failed pod (${perIndex !== undefined && perIndex !== null ? `backoffLimitPerIndex ${perIndex}` : `backoffLimit ${budget}`}); ` +
        'give it a restart budget (example: backoffLimitPerIndex: 3)');
  }
}

/* The container's arguments after `command[0]`, with $(VAR) expanded from its env. */
function argvOf(container, env) {
  return [...(container.command || []).slice(1), ...(container.args || [])]
    .map((a) => expand(String(a), env));
}

function labelsMatch(selector, labels) {
  return Object.entries(selector || {}).every(([k, v]) => labels && labels[k] === v);
}

function programOf(container) {
  const argv0 = (container.command && container.command[0]) || '';
  const p = path.basename(argv0);
  return PROGRAMS.includes(p) ? p : null;
}

function containerPort(container, port) {
  for (const p of container.ports || [])
    if (p.name === port || p.containerPort === port) return p.containerPort;
  return null;
}

function checkGroup(docs) {
  const configMaps = {};
  const services = {};
  const claims = {};
  for (const d of docs) {
    if (d.doc.kind === 'ConfigMap') configMaps[d.doc.metadata.name] = d.doc.data || {};
    if (d.doc.kind === 'Service') services[d.doc.metadata.name] = d;
    if (d.doc.kind === 'PersistentVolumeClaim') claims[d.doc.metadata.name] = d;
  }
  const workloads = [];
  for (const d of docs) {
    const { kind, metadata, spec } = d.doc;
    if (kind !== 'StatefulSet' && kind !== 'Job') continue;
    const tmpl = spec.template;
    const labels = (tmpl.metadata && tmpl.metadata.labels) || {};
    if (spec.selector && !labelsMatch(spec.selector.matchLabels, labels))
      problem(d.where, 'spec.selector.matchLabels does not match the pod template labels');
    const w = { d, kind, name: metadata.name, spec, tmpl, labels, configMaps };
    if (kind === 'StatefulSet') {
      const svc = services[spec.serviceName];
      if (!svc) {
        problem(d.where, `serviceName ${spec.serviceName}: no Service of that name next to it`);
      } else {
        if (svc.doc.spec.clusterIP !== 'None')
          problem(svc.where, 'the Service of a StatefulSet must be headless (clusterIP: None) for per-pod DNS names');
        if (!svc.doc.spec.selector || !labelsMatch(svc.doc.spec.selector, labels))
          problem(svc.where, `selector does not select the pods of StatefulSet ${metadata.name}`);
        for (const p of svc.doc.spec.ports || []) {
          const target = p.targetPort === undefined ? p.port : p.targetPort;
          const found = tmpl.spec.containers.map((c) => containerPort(c, target)).find((x) => x);
          if (!found) problem(svc.where, `port ${p.name || p.port}: targetPort ${target} is no containerPort of ${metadata.name}`);
          else if (found !== p.port)
            problem(svc.where, `port ${p.port} differs from the containerPort ${found}: a headless Service does not remap ports, clients connect to ${found}`);
        }
      }
      w.instances = spec.replicas === undefined ? 1 : spec.replicas;
    } else {
      if (spec.completionMode !== 'Indexed')
        problem(d.where, 'a trainer Job must be Indexed (completionMode: Indexed): the index is the trainer id');
      const completions = spec.completions === undefined ? 1 : spec.completions;
      const parallelism = spec.parallelism === undefined ? 1 : spec.parallelism;
      if (completions !== parallelism)
        problem(d.where, `completions ${completions} != parallelism ${parallelism}: in sync mode all trainers must run at once`);
      w.instances = completions;
    }
    for (const v of tmpl.spec.volumes || [])
      if (v.persistentVolumeClaim && !claims[v.persistentVolumeClaim.claimName])
        problem(d.where, `volume ${v.name}: PersistentVolumeClaim ${v.persistentVolumeClaim.claimName} is not defined next to it`);
    const pod = podsOf(w)[0];
    for (const c of tmpl.spec.containers) {
      if (!programOf(c))
        problem(d.where, `container ${c.name}: command[0] must be a pstrain program (${PROGRAMS.join(', ')})`);
      let missing = false;
      for (const src of c.envFrom || [])
        if (src.configMapRef && !configMaps[src.configMapRef.name] && !src.configMapRef.optional) {
          problem(d.where, `container ${c.name}: ConfigMap ${src.configMapRef.name} is not defined next to it`);
          missing = true;
        }
      if (!pod || missing || !programOf(c)) continue;
      let env;
      try {
        env = resolveEnv(c, pod, configMaps);
      } catch (e) {
        problem(`${d.where} container ${c.name}`, e.message);
        continue;
      }
      checkRecovery(w, c, env, argvOf(c, env));
    }
    workloads.push(w);
  }
  return workloads;
}

/* The pods a workload creates, as the kubelet sees them for fieldRef. */
function podsOf(w, extra = 0) {
  const pods = [];
  for (let i = 0; i < w.instances + extra; i++) {
    const labels = { ...w.labels };
    const annotations = { ...((w.tmpl.metadata && w.tmpl.metadata.annotations) || {}) };
    let name;
    if (w.kind === 'Job') {
      name = `${w.name}-${i}-x7k2p`;
      annotations['batch.kubernetes.io/job-completion-index'] = String(i);
      labels['batch.kubernetes.io/job-completion-index'] = String(i);
      labels['job-name'] = w.name;
    } else {
      name = `${w.name}-${i}`;
      labels['statefulset.kubernetes.io/pod-name'] = name;
      labels['apps.kubernetes.io/pod-index'] = String(i);
    }
    pods.push({ index: i, name, labels, annotations });
  }
  return pods;
}

/* ---- cases for tests/deploy_check.sh ---- */

function writeCases(groups, dir) {
  fs.mkdirSync(dir, { recursive: true });
  const rows = [];
  const emit = (name, program, env, args, exit, stderrHas, expect) => {
    name = name.replace(/[^A-Za-z0-9_.-]+/g, '_');
    fs.writeFileSync(path.join(dir, `${name}.env`),
      Object.entries(env).map(([k, v]) => `${k}=${v}\n`).join(''));
    fs.writeFileSync(path.join(dir, `${name}.args`), args.map((a) => `${a}\n`).join(''));
    fs.writeFileSync(path.join(dir, `${name}.expect.json`), JSON.stringify(expect || {}) + '\n');
    rows.push([name, program, exit, stderrHas || '-'].join('\t'));
  };
  for (const [group, workloads] of groups) {
    const gname = path.basename(group).replace(/\.ya?ml$/, '');
    const psets = workloads.filter((w) => w.kind === 'StatefulSet' &&
      w.tmpl.spec.containers.some((c) => programOf(c) === 'pserver'));
    const jobs = workloads.filter((w) => w.kind === 'Job');
    /* Where the pservers really are: pod i of the StatefulSet, at its containerPort. */
    const topology = [];
    for (const w of psets) {
      const c = w.tmpl.spec.containers.find((x) => programOf(x) === 'pserver');
      const port = (c.ports && c.ports[0] && c.ports[0].containerPort) || null;
      for (let i = 0; i < w.instances; i++)
        topology.push({ host: `${w.name}-${i}.${w.spec.serviceName}`, port });
    }
    const trainers = jobs.length === 1 ? jobs[0].instances : null;
    for (const w of workloads) {
      for (const c of w.tmpl.spec.containers) {
        const program = programOf(c);
        if (!program) continue;
        const base = `${gname}.${w.name}.${c.name}`;
        let first = null;
        for (const pod of podsOf(w)) {
          let env, args;
          try {
            env = resolveEnv(c, pod, w.configMaps);
            args = argvOf(c, env);
          } catch (e) {
            problem(`${w.d.where} container ${c.name}`, e.message);
            continue;
          }
          const expect = { role: program, pservers: topology };
          /* Checkpoints and recovery as checked above (checkRecovery): the program must
           * resolve the same directory and failure mode, and a pserver its ordinal. */
          const dir = checkpointDirOf(env, args);
          expect.checkpoint_dir = dir ? dir.value : '';
          expect.on_failure = onFailureOf(env, args);
          if (dir && program === 'pserver') expect.pserver_id = pod.index;
          /* Threads (trainer: BLAS, pserver: RPC and update) must fit the container's CPU
           * limit, not the node's core count. */
          const cpu = c.resources && c.resources.limits && c.resources.limits.cpu;
          if (cpu !== undefined)
            expect[program === 'trainer' ? 'threads' : 'server_threads'] = Math.ceil(quantity(cpu) - 1e-9);
          if (program === 'trainer') {
            expect.trainer_id = pod.index;
            if (trainers !== null) expect.trainers = trainers;
          } else {
            const port = (c.ports && c.ports[0] && c.ports[0].containerPort) || null;
            if (port !== null) expect.port = port;
            /* Paddle's pserver listens on POD_IP (pstrain: PSTRAIN_BIND). */
            const podIpVar = (c.env || []).find((e) => e.valueFrom && e.valueFrom.fieldRef &&
              e.valueFrom.fieldRef.fieldPath === 'status.podIP' && ['POD_IP', 'PSTRAIN_BIND'].includes(e.name));
            expect.bind = podIpVar ? POD_IP : '0.0.0.0';
          }
          emit(`${base}.${pod.index}`, program, env, args, 0, null, expect);
          if (!first) first = { env, args };
        }
        if (!first) continue;
        /* Negative cases: a broken variable of this manifest must be a one-line error
         * naming it. */
        const breakVar = program === 'trainer'
          ? [['PSTRAIN_TRAINERS', 'PADDLE_TRAINERS_NUM'], 'two']
          : [['PSTRAIN_PORT', 'PADDLE_PORT'], 'http'];
        const victim = breakVar[0].find((n) => Object.prototype.hasOwnProperty.call(first.env, n));
        if (victim)
          emit(`${base}.broken-${victim}`, program, { ...first.env, [victim]: breakVar[1] },
            first.args, 2, victim, null);
        else
          problem(`${w.d.where} container ${c.name}`, `sets none of ${breakVar[0].join(', ')}`);
        /* One pod past the trainer count, as when completions is raised alone. */
        if (w.kind === 'Job') {
          const extra = podsOf(w, 1)[w.instances];
          try {
            const env = resolveEnv(c, extra, w.configMaps);
            emit(`${base}.index-past-trainers`, program, env, argvOf(c, env), 2, 'TRAINER_ID', null);
          } catch (e) {
            problem(`${w.d.where} container ${c.name}`, e.message);
          }
        }
      }
    }
  }
  fs.writeFileSync(path.join(dir, 'cases.tsv'), rows.map((r) => r + '\n').join(''));
  return rows.length;
}

/* ---- --compare, --same, --get ---- */

function oneJson(file) {
  const lines = fs.readFileSync(file, 'utf8').split('\n').filter((l) => l !== '');
  if (lines.length !== 1) throw new Error(`${file}: expected one line of JSON, got ${lines.length}`);
  return JSON.parse(lines[0]);
}

function compare(expectFile, outputFile) {
  const expect = JSON.parse(fs.readFileSync(expectFile, 'utf8'));
  let got;
  try {
    got = oneJson(outputFile);
  } catch (e) {
    return [e.message];
  }
  const errs = [];
  for (const [k, want] of Object.entries(expect)) {
    if (k === 'pservers') {
      /* Each entry i must be pod i of the StatefulSet (short or longer DNS name) at its
       * containerPort, in order: what the ConfigMap lists must be what the cluster runs. */
      const list = String(got.pservers || '').split(',').filter((x) => x);
      const ok = list.length === want.length && list.every((entry, i) => {
        const colon = entry.lastIndexOf(':');
        const host = entry.slice(0, colon), port = Number(entry.slice(colon + 1));
        return (host === want[i].host || host.startsWith(want[i].host + '.')) && port === want[i].port;
      });
      if (!ok)
        errs.push(`pservers: got "${got.pservers}", the StatefulSet(s) run ` +
          `"${want.map((p) => `${p.host}:${p.port}`).join(',')}"`);
    } else if (got[k] !== want) {
      errs.push(`${k}: got ${JSON.stringify(got[k])}, expected ${JSON.stringify(want)}`);
    }
  }
  return errs;
}

/* --same A B KEYS: two --check-config outputs agree on every key but KEYS (comma list). */
function same(a, b, ignore) {
  const x = oneJson(a), y = oneJson(b);
  const skip = new Set(ignore ? ignore.split(',') : []);
  const keys = new Set([...Object.keys(x), ...Object.keys(y)]);
  return [...keys].filter((k) => !skip.has(k) && JSON.stringify(x[k]) !== JSON.stringify(y[k]))
    .map((k) => `${k}: ${JSON.stringify(x[k])} vs ${JSON.stringify(y[k])}`);
}

/* ---- main ---- */

function manifestFiles(p) {
  const st = fs.statSync(p);
  if (!st.isDirectory()) return [p];
  return fs.readdirSync(p).filter((f) => /\.ya?ml$/.test(f)).sort().map((f) => path.join(p, f));
}

function main(argv) {
  if (argv[0] === '--compare') {
    if (argv.length !== 3) {
      console.error('usage: validate.js --compare EXPECT.json OUTPUT');
      return 2;
    }
    const errs = compare(argv[1], argv[2]);
    errs.forEach((e) => console.log(e));
    return errs.length ? 1 : 0;
  }
  if (argv[0] === '--same' || argv[0] === '--get') {
    try {
      if (argv[0] === '--get') {
        const v = oneJson(argv[2])[argv[1]];
        if (v === undefined) throw new Error(`${argv[2]}: no key ${argv[1]}`);
        console.log(v);
        return 0;
      }
      const errs = same(argv[1], argv[2], argv[3]);
      errs.forEach((e) => console.log(e));
      return errs.length ? 1 : 0;
    } catch (e) {
      console.log(e.message);
      return 1;
    }
  }
  let casesDir = null;
  const paths = [];
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === '--cases') casesDir = argv[++i];
    else if (argv[i].startsWith('--')) {
      console.error(`validate.js: unknown option ${argv[i]}`);
      return 2;
    } else paths.push(argv[i]);
  }
  if (paths.length === 0) {
    const deploy = path.resolve(__dirname, '..');
    for (const f of fs.readdirSync(deploy).sort())
      if (/^k8s/.test(f) && fs.statSync(path.join(deploy, f)).isDirectory())
        paths.push(path.relative(process.cwd(), path.join(deploy, f)) || '.');
  }
  const groups = new Map();
  let ndocs = 0;
  for (const p of paths) {
    if (!fs.existsSync(p)) {
      problem(p, 'no such file or directory');
      continue;
    }
    const docs = [];
    const files = manifestFiles(p);
    if (files.length === 0) problem(p, 'no .yaml files');
    for (const f of files) docs.push(...loadDocuments(f));
    ndocs += docs.length;
    for (const d of docs) console.log(`ok ${d.file}: document ${d.index} ${d.doc.kind}/${d.doc.metadata.name}`);
    groups.set(p, checkGroup(docs));
  }
  let ncases = 0;
  if (casesDir && problems.length === 0) ncases = writeCases(groups, casesDir);
  for (const m of problems) console.log(`FAIL ${m}`);
  console.log(`validate: ${ndocs} documents in ${paths.length} location(s), ` +
    `${problems.length} problem(s)${casesDir ? `, ${ncases} cases written to ${casesDir}` : ''}`);
  return problems.length ? 1 : 0;
}

process.exitCode = main(process.argv.slice(2));
