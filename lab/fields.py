"""What every surface says about the run's fields (`lab.config.RunConfig`): each field's label and
help in English and Russian (the guide's words: the form shows the help under the field, the
commands in --help, the notebook's parameters cell beside the parameter), and its command-line
flag. Control side only: the training notebook holds the fields without their words.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterable

from lab.config import RunConfig, field_choices, field_kind, field_names


@dataclass(frozen=True)
class Words:
    label_en: str
    label_ru: str
    flags: tuple[str, ...] = ()  # default: --the-field-name
    metavar: str | None = None
    en: str = ""
    ru: str = ""


WORDS: dict[str, Words] = {
    'resume_from': Words('Continue from checkpoint', 'Продолжить с чекпоинта', flags=('--resume',), metavar='PATH',
        en='A checkpoint file, or a run folder (its newest good checkpoint), to continue from; empty: from '
           'scratch. Training picks up the weights and the step number of the earlier run. The architecture '
           "is the checkpoint's: weights of another shape will not fit, so the model fields are locked.",
        ru='Обучение подхватывает веса и номер шага прошлого прогона. Архитектура при этом та же, что у '
           'чекпоинта: другой формы веса просто не лягут, поэтому поля модели закрыты.'),
    'constellations': Words('Constellations in training', 'Созвездия в обучении', flags=('--constellation', '-c'),
                            metavar='NAME',
        en='Which groups of datasets the text comes from. New data means a new held-out set, so val starts '
           'counting again.',
        ru='Из каких групп датасетов берётся текст. Новые данные — новая отложенная выборка, поэтому val '
           'начинает счёт заново.'),
    'context': Words('Context n', 'Контекст n',
        en='Tokens the model sees at once. Longer holds a longer thought, but attention gets dearer: memory '
           'and time grow with n.',
        ru='Сколько токенов модель видит за раз. Длиннее — держит более длинную мысль, но внимание дорожает: '
           'память и время растут вместе с n.'),
    'width': Words('Width d', 'Ширина d',
        en='The length of the vector that describes each token. Weights grow as d²: doubling d gives about 4×'
           ' the weights.',
        ru='Длина вектора, которым модель описывает каждый токен. Веса растут как d²: удвоить d — примерно '
           'вчетверо больше весов.'),
    'heads': Words('Heads', 'Головы',
        en='How many parallel “views” attention is split into. d must divide by heads: 512 / 8 makes 64 per '
           'head, the usual size.',
        ru='На сколько параллельных «взглядов» делится внимание. d делится на головы без остатка: 512 / 8 = '
           '64 на голову, это обычная величина.'),
    'layers': Words('Layers', 'Слои',
        en='Depth: how many times in a row the model reworks the text. Weights and time grow almost linearly:'
           ' 12 layers are about 1.5× bigger and slower than 8.',
        ru='Глубина: сколько раз подряд модель перерабатывает текст. Веса и время растут почти линейно: 12 '
           'слоёв — примерно в полтора раза больше и медленнее, чем 8.'),
    'gpu': Words('GPU', 'Видеокарта',
        en='2×T4 on Kaggle is twice as fast as one T4: about 102 thousand tokens/s against 49 thousand. An '
           'own RTX 3050 is slower than one T4 and runs hot.',
        ru='2×T4 на Kaggle вдвое быстрее одной T4: около 102 тыс. токенов в секунду против 49 тыс. Своя RTX '
           '3050 медленнее одной T4 и греется.'),
    'machine': Words('Machine', 'Машина',
        en='A Kaggle account with its own quota. “Auto” picks a free machine: first one whose quota covers '
           'the whole run, then one that already has the checkpoint and the data. If the quota runs out '
           'early, the lab continues training on another free machine.',
        ru='Аккаунт Kaggle со своей квотой. «Авто» выбирает свободную машину: сперва ту, где квоты хватит на '
           'весь прогон, потом ту, где уже есть чекпоинт и данные. Если квота кончилась раньше, лаба '
           'продолжит обучение на другой свободной машине.'),
    'batch_per_card': Words('Batch per card', 'Батч на карту',
        en='Chunks of n tokens a card processes per step. A step on 2×T4 with batch 6 is 6 × 2 × 1024, or '
           '12,288 tokens. Bigger batch: smoother training, more memory. Failed with “CUDA out of memory”: '
           'lower the batch.',
        ru='Сколько кусков по n токенов карта обрабатывает за шаг. Шаг на 2×T4 с батчем 6 — это 6 × 2 × 1024 '
           '= 12 288 токенов. Больше батч — ровнее обучение, но больше памяти. Упало с «CUDA out of memory» —'
           ' уменьшите батч.'),
    'grad_accum': Words('Gradient accumulation', 'Накопление градиента',
        en='Micro-steps accumulated into one optimizer step.',
        ru='Сколько микрошагов копить в один шаг оптимизатора.'),
    'steps_until': Words('Steps until', 'Шагов до',
        en='The step at which training ends. It also sets the learning-rate schedule: the rate decays '
           'smoothly towards this step. Added data: raise it.',
        ru='Номер шага, на котором обучение закончится. Он же задаёт расписание скорости обучения: к этому '
           'шагу она плавно падает. Добавили данных — увеличьте.'),
    'limit_min': Words('Limit, min', 'Лимит, мин',
        en='Minutes allotted. At the limit training stops by itself and saves a checkpoint, even if “Steps '
           "until” was not reached. 630 minutes leave a margin before Kaggle's session limit.",
        ru='Сколько минут отвести. По лимиту обучение само остановится и сохранит чекпоинт, даже если до '
           '«Шагов до» не дошло. 630 минут оставляют запас до лимита сессии Kaggle.'),
    'schedule': Words('Schedule', 'Расписание',
        en='How the learning rate changes with the step: wsd (warmup, stable, decay), cosine, linear, '
           'inv_sqrt (1/√t). A small rate at the end is what converges precisely.',
        ru='Как скорость обучения меняется по шагам: wsd (разогрев, ровно, спад), cosine, linear, inv_sqrt '
           '(1/√t). К концу нужна малая скорость, чтобы сойтись точно.'),
    'lr': Words('Learning rate', 'Скорость обучения',
        en='The peak learning rate. Higher fits each batch faster, but above a threshold the loss explodes.',
        ru='Пиковая скорость обучения. Больше — быстрее подгоняет каждый батч, но выше порога loss взрывается.'),
    'warmup_steps': Words('Warmup steps', 'Шагов разогрева',
        en='Steps over which the rate rises from zero to its peak (at most a tenth of “Steps until”).',
        ru='Шаги, за которые скорость растёт от нуля до пика (не больше десятой части «Шагов до»).'),
    'decay_frac': Words('Decay fraction', 'Доля спада',
        en='WSD and inv_sqrt: the final fraction of steps over which the rate decays.',
        ru='WSD и inv_sqrt: доля последних шагов, на которых скорость спадает.'),
    'decay_start': Words('Decay from step', 'Спад с шага',
        en='WSD and inv_sqrt: the step where the decay begins; 0: from decay_frac. A cooldown branch sets it '
           'to the step it branches from.',
        ru='WSD и inv_sqrt: шаг, с которого скорость начинает спадать; 0 — по decay_frac. Ветка охлаждения '
           'ставит сюда шаг, от которого она ответвилась.'),
    'min_lr_frac': Words('Final rate fraction', 'Конечная доля скорости',
        en='The rate at steps_until, as a fraction of lr.',
        ru='Скорость на последнем шаге, как доля от lr.'),
    'rewarm_at': Words('Re-warm from step', 'Повторный разогрев с шага',
        en="The step a grown run's rate rises again from (lab.settle.grow); 0: none.",
        ru='Шаг, с которого скорость продолженного прогона снова растёт; 0 — нет.'),
    'rewarm_steps': Words('Re-warm steps', 'Шагов повторного разогрева',
        en='Steps of that re-warm.',
        ru='Шагов этого разогрева.'),
    'rewarm_from_frac': Words('Re-warm from rate', 'Разогрев от доли скорости',
        en='Its first rate, as a fraction of lr.',
        ru='Его начальная скорость, доля от lr.'),
    'weight_decay': Words('Weight decay', 'Затухание весов',
        en='AdamW weight decay (matrices only).',
        ru='Затухание весов AdamW (только матрицы).'),
    'grad_clip': Words('Gradient clipping', 'Обрезка градиента',
        en='Gradient norm clipping; 0 turns it off.',
        ru='Обрезка нормы градиента; 0 — выключить.'),
    'seed': Words('Seed', 'Зерно',
        en='Random seed.',
        ru='Зерно случайности.'),
    'eval_every': Words('Val every', 'Оценка val каждые',
        en='Steps between evaluations on the held-out set (and text samples).',
        ru='Шагов между оценками на отложенной выборке (и примерами текста).'),
    'eval_batches': Words('Val batches', 'Батчей на оценку val',
        en='Batches per val evaluation.',
        ru='Батчей на одну оценку val.'),
    'log_every': Words('Log every', 'Строка лога каждые',
        en='Steps between lines of metrics.jsonl.',
        ru='Шагов между строками metrics.jsonl.'),
    'checkpoint_every_min': Words('Checkpoint every, min', 'Чекпоинт каждые, мин',
        en='Minutes between periodic checkpoints.',
        ru='Минут между чекпоинтами.'),
    'parallel': Words('Several cards', 'Несколько карт',
        en='Several cards: auto (DDP under torchrun), ddp, dp (DataParallel), none.',
        ru='Несколько карт: auto, ddp, dp (DataParallel), none.'),
    'precision': Words('Precision', 'Точность',
        en='auto: bf16 from compute capability 8.0 on, fp16 with GradScaler below it; on a CPU, bf16 where '
           'the processor multiplies bf16 itself (AVX512-BF16, AMX), else fp32.',
        ru='auto: bf16 на картах от 8.0, fp16 с GradScaler ниже; на CPU — bf16, если процессор сам умножает '
           'bf16 (AVX512-BF16, AMX), иначе fp32.'),
    'torch_compile': Words('Compile', 'Компиляция',
        en='torch.compile the model: auto (on a GPU; on CPU when a C++ compiler is found and the run is long '
           'enough to repay the compile time), on, off. If compiling fails, training goes on uncompiled.',
        ru='torch.compile для модели: auto (на GPU; на CPU — если есть компилятор C++ и прогон достаточно '
           'длинный, чтобы окупить компиляцию), on, off. Если компиляция не удалась, обучение идёт без неё.'),
    'data_dir': Words('Data folder', 'Папка данных',
        en='Prepared data folder (shards, tokenizer, manifest); empty: found from constellations.',
        ru='Папка подготовленных данных; пусто — найти по созвездиям.'),
}


def field_help(name: str, lang: str = "en") -> str:
    w = WORDS[name]
    return w.ru if lang == "ru" else w.en


def field_label(name: str, lang: str = "en") -> str:
    w = WORDS[name]
    return w.label_ru if lang == "ru" else w.label_en


def flag_specs(exclude: Iterable[str] = ()) -> list[tuple[tuple[str, ...], dict]]:
    """One command-line flag per field, as `(option strings, add_argument keywords)`, so every
    command (`lab train`, `lab run`, `lab size`) takes the same flags with the same help:
    `for opts, kw in flag_specs(): parser.add_argument(*opts, **kw)`. Values arrive as text
    (a list field's flag repeats) and `lab.config.coerce` types them, so a bad value is a
    ConfigError in both languages rather than argparse's own message."""
    out = []
    for f in dataclasses.fields(RunConfig):
        if f.name in exclude:
            continue
        w, choices = WORDS[f.name], field_choices(f.name)
        kw: dict = {"dest": f.name, "default": None, "metavar": w.metavar or f.name.upper(),
                    "help": w.en + (f" ({', '.join(choices)})" if choices else "")}
        if field_kind(f.name) == "list":
            kw["action"] = "append"
        out.append((w.flags or ("--" + f.name.replace("_", "-"),), kw))
    return out


def missing_words() -> list[str]:
    """Fields without words, and words of no field (a test holds both empty)."""
    names = set(field_names())
    return sorted((names - set(WORDS)) | (set(WORDS) - names))
