// The official `e2b` JS SDK, unchanged, against `omabox serve` (E2B_API_URL,
// E2B_SANDBOX_URL and E2B_API_KEY point at it). Every check throws on a wrong answer; the
// last line printed is `OK`. Access tokens seen are written to $TOKENS_OUT so the Rust test
// can check that serve's log holds none of them. Run from the npm prefix holding `e2b`.
import { writeFileSync } from 'node:fs'
import { Sandbox, CommandExitError, NotFoundError, AuthenticationError, SandboxError } from 'e2b'

const tokens = []
function check(condition, what) {
  if (!condition) throw new Error(`FAILED: ${what}`)
  console.log(`ok: ${what}`)
}
async function refused(promise, kind, what) {
  try {
    await promise
  } catch (e) {
    check(e instanceof kind, `${what} (${e.constructor.name}: ${e.message})`)
    return e
  }
  throw new Error(`FAILED: ${what}: no error`)
}

const sbx = await Sandbox.create({ timeoutMs: 120_000, metadata: { suite: 'js' }, envs: { GREETING: 'hi' } })
tokens.push(sbx.envdAccessToken)

let r = await sbx.commands.run('echo $GREETING; echo oops >&2')
check(r.stdout === 'hi\n' && r.stderr === 'oops\n' && r.exitCode === 0, 'run: stdout, stderr, exit 0')
const failed = await refused(sbx.commands.run('echo bad >&2; exit 3'), CommandExitError, 'a failing command throws')
check(failed.exitCode === 3 && failed.stderr.includes('bad'), 'with its exit code and stderr')
r = await sbx.commands.run('pwd; echo $X', { cwd: '/tmp', envs: { X: 'y' } })
check(r.stdout === '/tmp\ny\n', 'cwd and envs')

// Output streams as written: the command waits for a file written once its first line came.
const seen = []
const handle = await sbx.commands.run('echo ready; while [ ! -f /tmp/go ]; do sleep 0.02; done; echo done', {
  background: true,
  onStdout: (data) => {
    seen.push(data)
    if (data === 'ready\n') sbx.files.write('/tmp/go', '')
  },
})
r = await handle.wait()
check(seen.join('') === 'ready\ndone\n', 'output streams as written, in order')

// stdin, background, kill.
const cat = await sbx.commands.run('cat', { background: true, stdin: true })
await sbx.commands.sendStdin(cat.pid, 'typed\n')
await sbx.commands.closeStdin(cat.pid)
check((await cat.wait()).stdout === 'typed\n', 'stdin reaches the command and closes')
const sleeper = await sbx.commands.run('sleep 60', { background: true })
check((await sbx.commands.list()).some((p) => p.pid === sleeper.pid), 'a background command is listed')
check(await sbx.commands.kill(sleeper.pid), 'kill answers true')
await refused(sleeper.wait(), CommandExitError, 'a killed command does not succeed')

// Files.
await sbx.files.write('/tmp/dir/a.txt', 'content')
check((await sbx.files.read('/tmp/dir/a.txt')) === 'content', 'text write then read')
const blob = new Uint8Array(256 * 1024).map((_, i) => i % 256)
await sbx.files.write('/tmp/dir/blob', blob)
const back = await sbx.files.read('/tmp/dir/blob', { format: 'bytes' })
check(back.length === blob.length && back.every((b, i) => b === blob[i]), 'binary bytes survive')
const names = (await sbx.files.list('/tmp/dir')).map((e) => e.name).sort()
check(names.join(',') === 'a.txt,blob', `list: ${names}`)
check((await sbx.files.exists('/tmp/dir/a.txt')) && !(await sbx.files.exists('/tmp/nope')), 'exists')
await refused(sbx.files.read('/tmp/nope'), NotFoundError, 'a missing file is NotFound')

// Watching a directory through the streamed WatchDir.
await sbx.files.makeDir('/tmp/watched')
const fsEvents = []
const watch = await sbx.files.watchDir('/tmp/watched', (e) => fsEvents.push(`${e.type}:${e.name}`), { recursive: true })
await sbx.files.write('/tmp/watched/x.txt', 'x')
for (let i = 0; i < 500 && !fsEvents.includes('create:x.txt'); i++) await new Promise((r) => setTimeout(r, 20))
check(fsEvents.includes('create:x.txt'), `watchDir streams events: ${fsEvents}`)
await watch.stop()
// With includeEntry, each streamed event carries the path's info (read in the sandbox).
const entries = []
const withEntries = await sbx.files.watchDir('/tmp/watched', (e) => entries.push(e), { includeEntry: true })
await sbx.files.write('/tmp/watched/y.txt', '12345')
for (let i = 0; i < 500 && !entries.some((e) => e.name === 'y.txt' && e.type === 'create'); i++) await new Promise((r) => setTimeout(r, 20))
const created = entries.find((e) => e.name === 'y.txt' && e.type === 'create')
check(created && created.entry && created.entry.path === '/tmp/watched/y.txt' && created.entry.type === 'file', `an event's entry: ${JSON.stringify(created)}`)
await withEntries.stop()

// The control plane and refusals.
const listed = await Sandbox.list().nextItems()
check(listed.some((s) => s.sandboxId === sbx.sandboxId), 'Sandbox.list')
check((await sbx.getInfo()).metadata.suite === 'js', 'getInfo metadata')
await sbx.setTimeout(90_000)
await refused(Sandbox.connect('nosuchsandbox0000000'), SandboxError, 'an unknown sandbox is refused')
await refused(Sandbox.create({ apiKey: 'wrong-key' }), AuthenticationError, 'a wrong API key is refused')

// A filesystem snapshot (this SDK sends no mode: served as one) and a sandbox from it.
await sbx.files.write('/workspace/snap.txt', 'kept by the snapshot')
const snap = await sbx.createSnapshot({ name: 'js-snap' })
check(snap.snapshotId === 'js-snap:default', `createSnapshot: ${snap.snapshotId}`)
const fromSnap = await Sandbox.create(snap.snapshotId, { timeoutMs: 60_000 })
tokens.push(fromSnap.envdAccessToken)
check((await fromSnap.files.read('/workspace/snap.txt')) === 'kept by the snapshot', 'a sandbox from a snapshot has its files')
const snaps = await Sandbox.listSnapshots().nextItems()
check(snaps.map((s) => s.snapshotId).includes('js-snap:default'), 'listSnapshots')
await fromSnap.kill()
check((await Sandbox.deleteSnapshot(snap.snapshotId)) === true, 'deleteSnapshot')
check((await Sandbox.deleteSnapshot(snap.snapshotId)) === false, 'deleting it again answers false')

await sbx.kill()
await refused(sbx.commands.run('true'), Error, 'a killed sandbox runs nothing')

writeFileSync(process.env.TOKENS_OUT, tokens.join('\n'))
console.log('OK')
