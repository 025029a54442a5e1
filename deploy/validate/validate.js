#!/usr/bin/env node
/* validate.js — offline checks of pstrain's Kubernetes manifests (no cluster needed).
 *
 *   node validate.js [--cases DIR] [PATH ...]
 *     PATH: manifest files or directories (default: every deploy/k8s*\/ directory).
 *     1. parses every YAML document and validates it against the Kubernetes schema of its
 *        apiVersion/kind (the kubernetes-models classes' .validate()), and also rejects
 *        fields the schema does not know (the schemas alone accept `replica: 2`);
 *        cert-manager's objects (Certificate, Issuer) are validated the same way, with the
 *        models of @kubernetes-models/cert-manager;
 *     2. checks what the documents of one directory must agree on (Service <-> StatefulSet,
 *        Indexed Job completions = parallelism, referenced ConfigMaps and
 *        PersistentVolumeClaims exist, selectors), and what checkpoints and recovery need:
 *        a checkpoint directory (PSTRAIN_CHECKPOINT_DIR or --checkpoint-dir) on a writable
 *        volume backed by a PersistentVolumeClaim, a pserver id with it, and a trainer Job
 *        that retries failed pods when its trainers wait for restarts (PSTRAIN_ON_FAILURE);
 *        and what the token and TLS need: every file a process reads its secrets from
 *        (PSTRAIN_TOKEN_FILE, PSTRAIN_TLS_*) lies on a volume mounted from a Secret defined
 *        next to it (a Secret, or a cert-manager Certificate's spec.secretName) that has the
 *        key the path names; no token in plain text (a ConfigMap, an env value, a flag) and
 *        none written into a committed Secret; pservers and trainers read the same token
 *        and agree on TLS; the pservers' Certificate names every address in
 *        PSTRAIN_PSERVERS (as gRPC matches names) with the right usages;
 *     3. with --cases DIR: for every container of every pod the workloads would create
 *        (each Job completion index, each StatefulSet ordinal), resolves the environment
 *        as the kubelet would (envFrom + env, $(VAR) expansion, fieldRef/resourceFieldRef
 *        substituted with realistic values) and writes a case for tests/deploy_check.sh:
 *          DIR/cases.tsv          name, program, expected exit status, stderr must contain
 *          DIR/<name>.env         KEY=VALUE lines (the container's whole environment)
 *          DIR/<name>.args        the container's arguments, one per line
 *          DIR/<name>.expect.json what `<program> --check-config` must report
 *        plus negative cases (a broken variable, a completion index past the trainer count,
 *        the shipped empty token placeholder) that must exit 2 with one line naming the
 *        variable.
 *        The files the pod would mount from Secrets do not exist here, and a program reads
 *        its token file while it loads its configuration: so each path under a Secret's
 *        mount is moved under DIR/fs (PSTRAIN_TOKEN_FILE=/etc/pstrain/token becomes
 *        DIR/fs/etc/pstrain/token, in the environment and in flags alike), a stand-in token
 *        is written there (the manifests hold only empty placeholders), and --compare
 *        takes DIR/fs off the paths the program reports again ("_root" of the expectation).
 *        The TLS files are not written: a program reads them only when it opens its
 *        transport, after --check-config has returned.
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

/* The packages whose models validate a document: Kubernetes' own kinds, and
 * cert-manager's (cert-manager.io/v1 Certificate, Issuer, ...). */
const MODEL_PACKAGES = ['kubernetes-models', '@kubernetes-models/cert-manager'];

function modelClass(apiVersion, kind) {
  if (typeof apiVersion !== 'string' || !/^([a-z0-9.-]+\/)?v[0-9a-z]+$/.test(apiVersion))
    return null;
  if (typeof kind !== 'string' || !/^[A-Z][A-Za-z0-9]*$/.test(kind))
    return null;
  for (const pkg of MODEL_PACKAGES) {
    let mod;
    try {
      mod = require(`${pkg}/${apiVersion}`);
    } catch (e) {
      continue;
    }
    if (typeof mod[kind] === 'function') return mod[kind];
  }
  return null;
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

/* The token offline, for a secretKeyRef and in the token files of the cases: the manifests
 * hold empty placeholders, not secrets. */
const TEST_TOKEN = 'deploy-check-stand-in-token';

/* The environment of `container` in `pod`, in the kubelet's order: envFrom sources, then
 * env entries (each may use $(VAR) of what precedes it). A secretKeyRef to a Secret of
 * `secrets` (secretsOf) resolves to TEST_TOKEN. */
function resolveEnv(container, pod, configMaps, secrets = {}) {
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
      } else if (vf.secretKeyRef) {
        const sec = secrets[vf.secretKeyRef.name];
        if (sec && sec.keys.has(vf.secretKeyRef.key)) v = TEST_TOKEN;
        else if (vf.secretKeyRef.optional) continue;
        else throw new Error(`env ${e.name}: Secret key ${vf.secretKeyRef.name}/${vf.secretKeyRef.key} is not defined next to this manifest`);
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
 * `w`: { mount, kind, volume } where kind is 'claim' (a volumeClaimTemplates entry of a
 * StatefulSet or a persistentVolumeClaim volume) or the volume's source (emptyDir,
 * secret, hostPath, ...) and volume the pod's volume (absent for a claim template); null
 * when dir is on the container's own filesystem. */
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
  if (v.persistentVolumeClaim) return { mount: best, kind: 'claim', volume: v };
  return { mount: best, kind: Object.keys(v).find((k) => k !== 'name') || 'undefined', volume: v };
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

/* ---- the token and TLS: files from Secrets ---- */

/* Settings that name a file a Secret must provide: [flag, variable, the roles that read it,
 * the --check-config key]. */
const SECRET_FILES = [
  ['token-file', 'PSTRAIN_TOKEN_FILE', PROGRAMS, 'token_file'],
  ['tls-cert', 'PSTRAIN_TLS_CERT', ['pserver'], 'tls_cert'],
  ['tls-key', 'PSTRAIN_TLS_KEY', ['pserver'], 'tls_key'],
  ['tls-ca', 'PSTRAIN_TLS_CA', PROGRAMS, 'tls_ca'],
  ['tls-client-cert', 'PSTRAIN_TLS_CLIENT_CERT', ['trainer'], 'tls_client_cert'],
  ['tls-client-key', 'PSTRAIN_TLS_CLIENT_KEY', ['trainer'], 'tls_client_key'],
];
/* The keys cert-manager writes into a Certificate's Secret (type kubernetes.io/tls). */
const CERT_KEYS = ['tls.crt', 'tls.key', 'ca.crt'];

/* The Secrets a directory defines, by name: { where, kind: 'Secret' | 'Certificate', keys,
 * values (Secret: key -> text), doc }. A cert-manager Certificate defines the Secret of
 * its spec.secretName, with the keys cert-manager writes. */
function secretsOf(docs) {
  const secrets = {};
  /* the issuers, for the certificates of cert-manager's CSI driver (csiCertificateFile) */
  secrets['\u0000issuers'] = docs.filter((d) => d.doc.kind === 'Issuer' || d.doc.kind === 'ClusterIssuer')
    .map((d) => ({ kind: d.doc.kind, name: d.doc.metadata && d.doc.metadata.name }));
  for (const d of docs) {
    const { kind, metadata, spec } = d.doc;
    let name, entry;
    if (kind === 'Secret') {
      const values = new Map();
      for (const [k, v] of Object.entries(d.doc.data || {})) values.set(k, Buffer.from(String(v), 'base64').toString('utf8'));
      for (const [k, v] of Object.entries(d.doc.stringData || {})) values.set(k, String(v));
      name = metadata.name;
      entry = { where: d.where, kind, keys: new Set(values.keys()), values, doc: d.doc };
    } else if (kind === 'Certificate' && spec && spec.secretName) {
      name = spec.secretName;
      entry = { where: d.where, kind, keys: new Set(CERT_KEYS), values: null, doc: d.doc };
    } else continue;
    if (secrets[name]) problem(d.where, `Secret ${name} is also defined by ${secrets[name].where}`);
    else secrets[name] = entry;
  }
  return secrets;
}

/* A file of a volume of cert-manager's CSI driver (csi.cert-manager.io): each pod gets a key
 * of its own and a certificate for it from the issuer its volumeAttributes name, as tls.crt,
 * tls.key and ca.crt (no Secret: no pod can read another's key). Returned as secretFile
 * does, with a Certificate-like entry (issuerRef, usages) for the checks of one directory;
 * the issuer must be defined next to it. */
function csiCertificateFile(w, m, csi, file, secrets) {
  if (csi.driver !== 'csi.cert-manager.io')
    throw new Error(`volume ${m.name} is a CSI volume of driver ${csi.driver}: only cert-manager's csi.cert-manager.io provides certificates`);
  const attrs = csi.volumeAttributes || {};
  const issuer = attrs['csi.cert-manager.io/issuer-name'];
  const kind = attrs['csi.cert-manager.io/issuer-kind'] || 'Issuer';
  if (!issuer) throw new Error(`volume ${m.name}: no csi.cert-manager.io/issuer-name in its volumeAttributes`);
  const defined = (secrets['\u0000issuers'] || []).some((i) => i.kind === kind && i.name === issuer);
  if (kind === 'Issuer' && !defined)
    throw new Error(`volume ${m.name}: Issuer ${issuer} is not defined next to it`);
  const rel = file.slice(m.mountPath.length).replace(/^\/+/, '');
  if (!CERT_KEYS.includes(rel))
    throw new Error(`volume ${m.name} (cert-manager's CSI driver) holds ${CERT_KEYS.join(', ')}, not ${rel}`);
  const usages = attrs['csi.cert-manager.io/key-usages'];
  const spec = { issuerRef: { name: issuer, kind }, commonName: attrs['csi.cert-manager.io/common-name'] };
  if (usages) spec.usages = usages.split(',').map((u) => u.trim());
  return { name: `csi ${m.name}`, key: rel,
    secret: { where: `${w.d.where} volume ${m.name}`, kind: 'Certificate', keys: new Set(CERT_KEYS), values: null, doc: { spec } } };
}

/* Which Secret and key provide `file` in container `c` of workload `w`: { name, key,
 * secret }, or throws an Error that says what is wrong. */
function secretFile(w, c, file, secrets) {
  if (!file.startsWith('/')) throw new Error('not an absolute path');
  const vol = volumeAt(w, c, file);
  if (!vol)
    throw new Error(`no volume is mounted there, so the file would not exist; mount the Secret that holds it (a secret volume) at ${path.posix.dirname(file)}`);
  const m = vol.mount;
  if (vol.kind === 'undefined') throw new Error(`volumeMount ${m.name} names no volume of the pod`);
  if (vol.kind === 'csi') return csiCertificateFile(w, m, vol.volume.csi, file, secrets);
  if (vol.kind !== 'secret')
    throw new Error(`volume ${m.name} mounted at ${m.mountPath} is ${vol.kind === 'claim' ? 'a PersistentVolumeClaim' : vol.kind}, not a Secret: a secret must come from a Secret (a secret volume)`);
  const sv = vol.volume.secret;
  const sec = secrets[sv.secretName];
  if (!sec)
    throw new Error(`volume ${m.name}: Secret ${sv.secretName} is not defined next to it (no Secret, and no cert-manager Certificate with that secretName)`);
  let rel = file.slice(m.mountPath.length).replace(/^\/+/, '');
  if (m.subPath) rel = rel ? `${m.subPath}/${rel}` : m.subPath;
  let key = rel;
  if (sv.items) {
    const item = sv.items.find((i) => i.path === rel);
    if (!item)
      throw new Error(`volume ${m.name} mounts only ${sv.items.map((i) => i.path).join(', ')} of Secret ${sv.secretName} (items), not ${rel}`);
    key = item.key;
  }
  if (!sec.keys.has(key))
    throw new Error(`Secret ${sv.secretName} has no key ${key} (it has ${[...sec.keys].join(', ') || 'none'}), so ${file} would not exist`);
  return { name: sv.secretName, key, secret: sec };
}

/* The token and the TLS files of container `c` (program `program`) of workload `w`:
 * records problems and returns { token: 'Secret NAME key KEY' | null, files: [{ flag,
 * env (the variable), out (its --check-config key), value (the path), name, key, secret
 * (the Secret that provides it, secretsOf) }] }. */
function checkSecrets(w, c, program, env, args, secrets) {
  const where = `${w.d.where} container ${c.name}`;
  const info = { token: null, files: [] };
  for (const [flag, envName, roles, outKey] of SECRET_FILES) {
    if (!roles.includes(program)) continue;
    const s = settingOf(env, args, flag, envName);
    if (!s || s.value === '') continue;
    let f;
    try {
      f = secretFile(w, c, s.value, secrets);
    } catch (e) {
      problem(where, `${s.source}=${s.value}: ${e.message}`);
      continue;
    }
    info.files.push({ flag, env: envName, out: outKey, value: s.value, ...f });
    if (envName === 'PSTRAIN_TOKEN_FILE') {
      info.token = `Secret ${f.name} key ${f.key}`;
      checkCommitted(f.secret, f.name, f.key);
    }
  }
  /* PSTRAIN_TOKEN itself: only from a Secret (secretKeyRef), never written out. */
  for (const e of c.env || []) {
    if (e.name !== 'PSTRAIN_TOKEN') continue;
    const ref = e.valueFrom && e.valueFrom.secretKeyRef;
    if (!ref) {
      problem(where, `env PSTRAIN_TOKEN: a token in plain text (${e.valueFrom ? 'from a ConfigMap' : 'a value'}) is no secret: ` +
        'whoever reads the manifest or the pod spec has it; mount a Secret and set PSTRAIN_TOKEN_FILE (or use valueFrom.secretKeyRef)');
    } else if (secrets[ref.name] && secrets[ref.name].keys.has(ref.key)) {
      info.token = `Secret ${ref.name} key ${ref.key}`;
      const sec = secrets[ref.name];
      checkCommitted(sec, ref.name, ref.key);
      if (program === 'pserver' && sec.values && sec.values.get(ref.key).trim() === '')
        problem(where, `env PSTRAIN_TOKEN from Secret ${ref.name} key ${ref.key}, empty here: an empty PSTRAIN_TOKEN is no token, ` +
          'so this pserver would accept anyone until the real Secret is made; read it from a file (PSTRAIN_TOKEN_FILE), which refuses to start when empty');
    }
    /* a missing Secret or key: resolveEnv reports it */
  }
  for (let i = 0; i < args.length; i++)
    if (args[i] === '--token' || args[i].startsWith('--token='))
      problem(where, `${args[i].split('=')[0]} in the arguments: a token in plain text is no secret (the pod spec and ps show it); ` +
        'mount a Secret and pass --token-file');
  return info;
}

/* A Secret of these manifests that holds a token: it must be an empty placeholder (a
 * committed token is known to whoever reads the repository). */
const committedChecked = new Set();
function checkCommitted(sec, name, key) {
  if (sec.kind !== 'Secret' || committedChecked.has(sec)) return;
  committedChecked.add(sec);
  if (sec.values.get(key).trim() !== '')
    problem(sec.where, `key ${key} holds a token: a token written into a manifest is known to whoever reads the repository; ` +
      `leave it empty here ("") and make the real Secret with kubectl create secret generic ${name} --from-literal=${key}="$(openssl rand -hex 32)"`);
}

/* gRPC's host name check (tsi_ssl_peer_matches_name): an exact match, or "*.REST" when the
 * name's part after its first dot equals REST and REST itself has a dot (so *.example never
 * matches a.example). Case-insensitive; a trailing dot is ignored. */
function grpcNameMatches(pattern, name) {
  const p = pattern.toLowerCase().replace(/\.$/, ''), n = name.toLowerCase().replace(/\.$/, '');
  if (p === n) return true;
  if (!p.startsWith('*.') || p.length < 3) return false;
  const dot = n.indexOf('.');
  if (dot < 0) return false;
  const rest = n.slice(dot + 1);
  return rest.includes('.') && rest === p.slice(2);
}

/* The addresses a trainer dials, without their ports. */
function pserverHosts(env, args) {
  const s = settingOf(env, args, 'pservers', 'PSTRAIN_PSERVERS') ||
    (env.PADDLE_PSERVERS_IP_PORT_LIST !== undefined ? { value: env.PADDLE_PSERVERS_IP_PORT_LIST, source: 'PADDLE_PSERVERS_IP_PORT_LIST' } : null);
  if (!s) return null;
  const hosts = s.value.split(',').filter((x) => x).map((e) => {
    const colon = e.lastIndexOf(':');
    return (colon > 0 ? e.slice(0, colon) : e).replace(/^\[(.*)\]$/, '$1');
  });
  return { hosts, source: s.source };
}

function issuerOf(sec) {
  if (!sec || sec.kind !== 'Certificate') return null;
  const r = sec.doc.spec.issuerRef || {};
  return `${r.kind || 'Issuer'} ${r.name}`;
}

/* What the pservers and trainers of one directory must agree on: the token, TLS on both
 * sides, client certificates for mutual TLS, the CA, and the names the pservers'
 * certificate gives. `procs`: [{ w, c, program, env, args, info }]. */
function checkAuth(procs) {
  const name = (p) => `${p.program} (${p.w.kind} ${p.w.name})`;
  const file = (p, envName) => p.info.files.find((f) => f.env === envName);
  /* one token for all: a trainer with another token (or none) is refused */
  const tokens = new Map(procs.map((p) => [name(p), p.info.token || 'no token']));
  if (new Set(tokens.values()).size > 1)
    problem(procs[0].w.d.where.split(':')[0], 'pservers and trainers must share one token, but ' +
      [...tokens].map(([n, t]) => `${n} reads ${t}`).join(', '));
  const pservers = procs.filter((p) => p.program === 'pserver');
  const trainers = procs.filter((p) => p.program === 'trainer');
  for (const ps of pservers) {
    const cert = file(ps, 'PSTRAIN_TLS_CERT'), key = file(ps, 'PSTRAIN_TLS_KEY'), ca = file(ps, 'PSTRAIN_TLS_CA');
    const where = `${ps.w.d.where} container ${ps.c.name}`;
    if (cert && key && cert.name !== key.name)
      problem(where, `PSTRAIN_TLS_CERT is from Secret ${cert.name} but PSTRAIN_TLS_KEY from Secret ${key.name}: the key must be the certificate's`);
    if (cert && cert.secret.kind === 'Certificate') {
      const spec = cert.secret.doc.spec;
      if (spec.usages && !spec.usages.includes('server auth'))
        problem(cert.secret.where, `usages ${JSON.stringify(spec.usages)} lack "server auth": the pservers serve TLS with this certificate, and the trainers would refuse it`);
    }
    for (const tr of trainers) {
      const twhere = `${tr.w.d.where} container ${tr.c.name}`;
      const tca = file(tr, 'PSTRAIN_TLS_CA'), tcert = file(tr, 'PSTRAIN_TLS_CLIENT_CERT');
      if (cert && !tca)
        problem(twhere, `sets no PSTRAIN_TLS_CA, but the pservers of ${ps.w.kind} ${ps.w.name} serve TLS: the trainer would speak plaintext to them; mount the CA (ca.crt) and set PSTRAIN_TLS_CA`);
      if (!cert && tca)
        problem(twhere, `PSTRAIN_TLS_CA is set, but the pservers of ${ps.w.kind} ${ps.w.name} serve without TLS (no PSTRAIN_TLS_CERT)`);
      if (ca && !tcert)
        problem(twhere, `sets no PSTRAIN_TLS_CLIENT_CERT, but the pservers of ${ps.w.kind} ${ps.w.name} require client certificates (PSTRAIN_TLS_CA on a pserver: mutual TLS); mount the trainers' certificate and set PSTRAIN_TLS_CLIENT_CERT and PSTRAIN_TLS_CLIENT_KEY`);
      /* The CA a side trusts must be the one that signed the other side's certificate: with
       * cert-manager, the same issuer. */
      if (cert && tca && issuerOf(cert.secret) && issuerOf(tca.secret) && issuerOf(cert.secret) !== issuerOf(tca.secret))
        problem(twhere, `PSTRAIN_TLS_CA is the CA of ${issuerOf(tca.secret)}, but the pservers' certificate comes from ${issuerOf(cert.secret)}`);
      if (ca && tcert && issuerOf(ca.secret) && issuerOf(tcert.secret) && issuerOf(ca.secret) !== issuerOf(tcert.secret))
        problem(where, `PSTRAIN_TLS_CA is the CA of ${issuerOf(ca.secret)}, but the trainers' client certificate comes from ${issuerOf(tcert.secret)}`);
      if (cert && tca && cert.secret.kind === 'Certificate') {
        /* The pservers' certificate must name every address the trainers dial. */
        const dialed = pserverHosts(tr.env, tr.args);
        const spec = cert.secret.doc.spec;
        const dns = spec.dnsNames || [], ips = spec.ipAddresses || [];
        for (const h of dialed ? dialed.hosts : []) {
          const isIp = /^[0-9.]+$/.test(h) || h.includes(':');
          if (isIp ? ips.includes(h) : dns.some((n) => grpcNameMatches(n, h))) continue;
          const near = isIp ? [] : dns.filter((n) => n.startsWith('*.') && h.toLowerCase().endsWith(n.slice(1).toLowerCase()));
          problem(cert.secret.where, `${isIp ? 'ipAddresses' : 'dnsNames'} do not name ${h}, which ${dialed.source} lists: ` +
            `the trainers would refuse that pserver's certificate; add ${h}` +
            (near.length ? ` (${near.join(', ')} does not cover it: gRPC matches a wildcard only when what follows "*." has a dot itself)` : ''));
        }
      }
      if (tcert && tcert.secret.kind === 'Certificate') {
        const spec = tcert.secret.doc.spec;
        if (spec.usages && !spec.usages.includes('client auth'))
          problem(tcert.secret.where, `usages ${JSON.stringify(spec.usages)} lack "client auth": the trainers present this certificate to the pservers, which would refuse it`);
      }
    }
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
    if (d.doc.kind === 'ConfigMap' && Object.prototype.hasOwnProperty.call(d.doc.data || {}, 'PSTRAIN_TOKEN'))
      problem(d.where, 'PSTRAIN_TOKEN: a token in a ConfigMap is in plain text for whoever reads the manifest or the ConfigMap; ' +
        'put it in a Secret, mount it and set PSTRAIN_TOKEN_FILE');
  }
  const secrets = secretsOf(docs);
  const procs = [];
  const workloads = [];
  for (const d of docs) {
    const { kind, metadata, spec } = d.doc;
    if (kind !== 'StatefulSet' && kind !== 'Job') continue;
    const tmpl = spec.template;
    const labels = (tmpl.metadata && tmpl.metadata.labels) || {};
    if (spec.selector && !labelsMatch(spec.selector.matchLabels, labels))
      problem(d.where, 'spec.selector.matchLabels does not match the pod template labels');
    const w = { d, kind, name: metadata.name, spec, tmpl, labels, configMaps, secrets, secretInfo: {} };
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
        env = resolveEnv(c, pod, configMaps, secrets);
      } catch (e) {
        problem(`${d.where} container ${c.name}`, e.message);
        continue;
      }
      const args = argvOf(c, env);
      checkRecovery(w, c, env, args);
      const info = checkSecrets(w, c, programOf(c), env, args, secrets);
      w.secretInfo[c.name] = info;
      procs.push({ w, c, program: programOf(c), env, args, info });
    }
    workloads.push(w);
  }
  checkAuth(procs);
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

/* The environment and arguments with every file that a Secret provides (`files`, from
 * checkSecrets) moved under `root`, as if the pod's Secret volumes were mounted there; the
 * files of Secret documents are written there with content(file). A Certificate's files
 * are not written: the programs read them only when they open their transport, after
 * --check-config has returned. */
function moveSecretFiles(env, args, files, root, content) {
  const e = { ...env };
  let a = [...args];
  for (const f of files) {
    const to = root + f.value;
    if (e[f.env] === f.value) e[f.env] = to;
    a = a.map((x, i) => (x === `--${f.flag}=${f.value}` ? `--${f.flag}=${to}`
      : x === f.value && i > 0 && a[i - 1] === `--${f.flag}` ? to : x));
    if (f.secret.kind === 'Secret') {
      fs.mkdirSync(path.dirname(to), { recursive: true });
      fs.writeFileSync(to, content(f));
    }
  }
  return { env: e, args: a };
}

function writeCases(groups, dir) {
  fs.mkdirSync(dir, { recursive: true });
  /* Where the Secret volumes are "mounted": the positive cases share one tree (with
   * TEST_TOKEN in each token file), so their outputs compare equal across directories. */
  const root = path.join(path.resolve(dir), 'fs');
  const shippedRoot = path.join(path.resolve(dir), 'fs-shipped');
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
        const info = w.secretInfo[c.name] || { token: null, files: [] };
        let first = null;
        for (const pod of podsOf(w)) {
          let env, args;
          try {
            env = resolveEnv(c, pod, w.configMaps, w.secrets);
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
          /* The token and the TLS files, at the paths the pod would see them (--compare
           * takes `_root` off what the program reports). */
          expect.token = info.token ? 'set' : 'none';
          for (const [flag, envName, roles, out] of SECRET_FILES)
            if (roles.includes(program)) expect[out] = (settingOf(env, args, flag, envName) || { value: '' }).value;
          expect._root = root;
          const moved = moveSecretFiles(env, args, info.files, root, () => `${TEST_TOKEN}\n`);
          emit(`${base}.${pod.index}`, program, moved.env, moved.args, 0, null, expect);
          if (!first) first = { env: moved.env, args: moved.args, original: { env, args } };
        }
        if (!first) continue;
        /* The token Secret as shipped (an empty placeholder) must stop the program. */
        const tokenFile = info.files.find((f) => f.env === 'PSTRAIN_TOKEN_FILE');
        if (tokenFile && tokenFile.secret.kind === 'Secret') {
          const shipped = moveSecretFiles(first.original.env, first.original.args, info.files,
            path.join(shippedRoot, base), (f) => f.secret.values.get(f.key));
          emit(`${base}.placeholder-token`, program, shipped.env, shipped.args, 2, 'TOKEN_FILE', null);
        }
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
            const env = resolveEnv(c, extra, w.configMaps, w.secrets);
            const moved = moveSecretFiles(env, argvOf(c, env), info.files, root, () => `${TEST_TOKEN}\n`);
            emit(`${base}.index-past-trainers`, program, moved.env, moved.args, 2, 'TRAINER_ID', null);
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
  /* Paths under _root are the pod's paths moved there (moveSecretFiles): take it off. */
  const root = expect._root;
  if (root)
    for (const [k, v] of Object.entries(got))
      if (typeof v === 'string' && v.startsWith(`${root}/`)) got[k] = v.slice(root.length);
  for (const [k, want] of Object.entries(expect)) {
    if (k === '_root') continue;
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
