// E2B's full pause through the official `e2b` JS SDK, unchanged, against
// `omabox serve --backend gvisor` (E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY point at
// it): a process holding state only in its memory, `pause({ keepMemory: true })`, nothing
// running while paused, `Sandbox.connect` restoring it (same id and token, the counter going
// on, files kept), `fork({ count: 2 })` (each copy going on from the same memory with its own
// id, token and files), a memory snapshot and a sandbox created from it, a filesystem-only
// pause (processes end) and a paused sandbox's kill. Every check throws on a wrong answer;
// the last line printed is `OK`. Access tokens seen are written to $TOKENS_OUT. Run from the
// npm prefix holding `e2b`.
import { writeFileSync } from 'node:fs'
import { Sandbox, SandboxError } from 'e2b'

const tokens = []
function check(condition, what) {
  if (!condition) throw new Error(`FAILED: ${what}`)
  console.log(`ok: ${what}`)
}

const sbx = await Sandbox.create({ timeoutMs: 120_000, envs: { GREETING: 'hi' } })
tokens.push(sbx.envdAccessToken)
check((await sbx.commands.run('whoami')).stdout === 'user\n', "a command runs as E2B's user")
await sbx.files.write('/home/user/note.txt', 'in the home')

// A counter held only in a shell's memory, answering over fifos in /tmp (gVisor's memory).
await sbx.commands.run(
  'mkfifo /tmp/ask /tmp/answer && ' +
    '(i=0; while :; do read l < /tmp/ask; i=$((i+1)); echo $i > /tmp/answer; done) ' +
    '>/dev/null 2>&1 </dev/null &'
)
const ask = async (sandbox) =>
  (await sandbox.commands.run('echo x > /tmp/ask; cat /tmp/answer', { timeoutMs: 30_000 })).stdout.trim()
check((await ask(sbx)) === '1', 'the counter answers')
const sleeper = await sbx.commands.run('sleep 600', { background: true })

check((await sbx.pause({ keepMemory: true })) === true, 'a pause keeping the memory')
check((await Sandbox.getInfo(sbx.sandboxId)).state === 'paused', 'paused')
let refused = false
try {
  await sbx.commands.run('true', { timeoutMs: 10_000 })
} catch (e) {
  refused = e instanceof Error
}
check(refused, 'a paused sandbox runs nothing')

const resumed = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 60_000 })
check(resumed.sandboxId === sbx.sandboxId, 'resumed under the same id')
check(resumed.envdAccessToken === sbx.envdAccessToken, 'with the same token')
check((await ask(resumed)) === '2', 'the counter went on from its memory')
const alive = await resumed.commands.run(`kill -0 ${sleeper.pid} && echo alive`, { user: 'root' })
check(alive.stdout === 'alive\n', 'the background command runs on')
check((await resumed.files.read('/home/user/note.txt')) === 'in the home', 'files kept')

// Fork: every copy's counter goes on from the same point, separately.
const forks = await resumed.fork({ count: 2, timeoutMs: 60_000 })
check(forks.length === 2 && forks.every((f) => f instanceof Sandbox), `two forks (${forks})`)
for (const f of forks) tokens.push(f.envdAccessToken)
check(new Set([resumed.sandboxId, ...forks.map((f) => f.sandboxId)]).size === 3, 'each fork has its own id')
check(forks.every((f) => f.envdAccessToken !== resumed.envdAccessToken), 'and its own token')
check((await ask(forks[0])) === '3' && (await ask(forks[1])) === '3', 'each fork goes on from the checkpoint')
check((await ask(resumed)) === '3', 'the source runs on from the same point')
await forks[0].files.write('/home/user/mine.txt', 'fork 0')
check(!(await forks[1].files.exists('/home/user/mine.txt')), "forks' files are their own")
for (const f of forks) await f.kill()

// A memory snapshot: the source runs on; a sandbox created from it goes on from its memory.
const snap = await resumed.createSnapshot()
check((await ask(resumed)) === '4', 'the source runs on after its snapshot')
const child = await Sandbox.create(snap.snapshotId, { timeoutMs: 60_000 })
tokens.push(child.envdAccessToken)
check(child.sandboxId !== resumed.sandboxId, 'a sandbox from the snapshot has its own id')
check((await ask(child)) === '4', "it goes on from the snapshot's memory")
await child.kill()
check((await Sandbox.deleteSnapshot(snap.snapshotId)) === true, 'the snapshot is deleted')

// A filesystem-only pause keeps the files and ends the processes.
check((await resumed.pause({ keepMemory: false })) === true, 'a filesystem-only pause')
const cold = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 60_000 })
check((await cold.files.read('/home/user/note.txt')) === 'in the home', 'files kept by it')
const gone = await cold.commands.run(`kill -0 ${sleeper.pid} 2>/dev/null || echo gone`, { user: 'root' })
check(gone.stdout === 'gone\n', 'its processes ended')

// A paused sandbox's kill removes it.
check((await cold.pause()) === true, 'paused again')
await cold.kill()
let missing = false
try {
  await Sandbox.connect(sbx.sandboxId)
} catch (e) {
  missing = e instanceof SandboxError || e instanceof Error
}
check(missing, 'a killed paused sandbox is gone')

writeFileSync(process.env.TOKENS_OUT, tokens.join('\n'))
console.log('OK')
